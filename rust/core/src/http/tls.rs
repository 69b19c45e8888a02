//! TLS for `https://` endpoints: rustls with the *ring* provider.
//!
//! Python's `ssl` module cannot hand a TLS session to another library, so the
//! HTTP thread does the whole exchange, TLS included. Trusted roots are
//! Mozilla's (webpki-roots) plus the system's certificate store
//! (rustls-native-certs); `SSL_CERT_FILE` / `SSL_CERT_DIR`, when set, take
//! the place of the system store, which is how a private or self-signed CA
//! is trusted (docs/CLIENT.md). The configuration is built once per process.

use std::sync::{Arc, OnceLock};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};

fn build() -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let native = rustls_native_certs::load_native_certs();
    let env_file = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty());
    // A CA file the user named that cannot be read is an error, not a silent
    // fall-back to roots that would then reject the server.
    if let (Some(path), Some(err)) = (&env_file, native.errors.first()) {
        return Err(format!(
            "SSL_CERT_FILE={}: {err}",
            std::path::Path::new(path).display()
        ));
    }
    let (_added, _ignored) = roots.add_parsable_certificates(native.certs);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The process's client configuration (an error names what to fix).
pub fn client_config() -> Result<Arc<ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    CONFIG.get_or_init(build).clone()
}

/// A client connection to `host` (a name or an IP address).
pub fn connect(host: &str) -> Result<ClientConnection, String> {
    let config = client_config()?;
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| format!("{host:?} is not a valid TLS server name"))?;
    let mut conn = ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    // The request is queued before the handshake ends; never refuse it.
    conn.set_buffer_limit(None);
    Ok(conn)
}
