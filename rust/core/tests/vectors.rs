//! The normative test vectors of docs/PROTOCOL.md (`tests/vectors/*.json`):
//! every valid frame decodes to its stated meaning, every invalid one fails
//! with its exact error message.

use std::path::PathBuf;

use parallelhue_core::describe::frame_meaning;
use parallelhue_core::protocol::decode;
use serde_json::Value;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors")
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn vectors() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .expect("tests/vectors exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no vector files");
    let (mut valid, mut invalid) = (0, 0);
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for v in doc["valid"].as_array().expect("valid") {
            valid += 1;
            let name = v["name"].as_str().unwrap();
            let bytes = unhex(v["hex"].as_str().unwrap());
            match decode(&bytes) {
                Ok(f) => {
                    let got = frame_meaning(&f);
                    if got != v["frame"] {
                        failures.push(format!(
                            "{file}: {name}: decoded\n  {got}\nexpected\n  {}",
                            v["frame"]
                        ));
                    }
                }
                Err(e) => failures.push(format!("{file}: {name}: unexpected error {e}")),
            }
        }
        for v in doc["invalid"].as_array().expect("invalid") {
            invalid += 1;
            let name = v["name"].as_str().unwrap();
            let want = v["error"].as_str().unwrap();
            let bytes = unhex(v["hex"].as_str().unwrap());
            match decode(&bytes) {
                Ok(_) => failures.push(format!("{file}: {name}: decoded, expected {want:?}")),
                Err(e) if e.to_string() != want => failures.push(format!(
                    "{file}: {name}: got {:?}, expected {want:?}",
                    e.to_string()
                )),
                Err(_) => {}
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors failed:\n{}",
        failures.len(),
        valid + invalid,
        failures.join("\n")
    );
    assert!(valid > 0 && invalid > 0);
    eprintln!("{valid} valid and {invalid} invalid vectors pass");
}
