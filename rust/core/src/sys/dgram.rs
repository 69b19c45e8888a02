//! The telemetry socket's calls (Linux): an `AF_UNIX` datagram socket that
//! receives each sender's credentials, read one datagram or a batch at a time.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::cvt;

/// Bytes of control data kept per datagram: room for one `ucred`.
const CMSG_BUF: usize = 64;

/// One datagram's control buffer (aligned for `cmsghdr`).
pub(crate) type CmsgBuf = [u64; CMSG_BUF / 8];

/// Flags of every read: `MSG_TRUNC` makes the length the datagram's real one.
const RECV_FLAGS: libc::c_int = libc::MSG_DONTWAIT | libc::MSG_TRUNC | libc::MSG_CMSG_CLOEXEC;

/// What the kernel said of one datagram read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Datagram {
    /// Its real length (it may be longer than the buffer it was read into).
    pub len: usize,
    /// The sender's uid from `SCM_CREDENTIALS` (None: none came with it).
    pub uid: Option<u32>,
}

pub(crate) fn set_int_opt(
    fd: BorrowedFd<'_>,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: a pointer to an int of the given size; a bad `fd` is an error.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn get_int_opt(fd: BorrowedFd<'_>, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: pointers to an int and its length.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// The socket's receive buffer as the kernel reports it.
pub(crate) fn receive_buffer(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    get_int_opt(fd, libc::SO_RCVBUF)
}

/// Bytes of the next datagram queued (`FIONREAD`; 0: none).
pub(crate) fn queued_bytes(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut queued) })?;
    Ok(queued)
}

/// A non-blocking datagram socket bound at `path` (which must not exist),
/// its inode mode `mode` from the start, `SO_PASSCRED` on, and a receive
/// buffer of `rcvbuf` bytes when above 0 (`SO_RCVBUFFORCE` first when
/// `force`, else or when refused `SO_RCVBUF`; the kernel caps it).
pub(crate) fn bind_datagrams(
    path: &Path,
    mode: libc::mode_t,
    rcvbuf: libc::c_int,
    force: bool,
) -> io::Result<OwnedFd> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path of {} bytes does not fit sun_path ({} usable bytes): {}",
                bytes.len(),
                addr.sun_path.len() - 1,
                path.display()
            ),
        ));
    }
    if CString::new(bytes).is_err() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path contains a NUL byte",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: a plain syscall; the descriptor it returns is ours alone.
    let sock = unsafe {
        OwnedFd::from_raw_fd(cvt(libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        ))?)
    };
    let fd = sock.as_fd();
    // On Linux the socket file takes the socket inode's mode: right from the start.
    // SAFETY: a plain syscall on our descriptor.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
    set_int_opt(fd, libc::SO_PASSCRED, 1)?;
    if rcvbuf > 0 && (!force || set_int_opt(fd, libc::SO_RCVBUFFORCE, rcvbuf).is_err()) {
        set_int_opt(fd, libc::SO_RCVBUF, rcvbuf)?;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_un of at least `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    Ok(sock)
}

/// The sender's uid in the control messages the kernel filled in `msg`;
/// closes any descriptor a sender tried to pass.
fn sender_uid(msg: &libc::msghdr) -> Option<u32> {
    let mut uid = None;
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                uid = Some(cred.uid);
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                // Close any descriptor a sender tried to pass us.
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                    let fd: libc::c_int =
                        std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    libc::close(fd);
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    uid
}

/// Read one datagram into `buf` (the portable path, and the fallback where
/// `recvmmsg` is not available).
pub(crate) fn recv_one(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    cbuf: &mut CmsgBuf,
) -> io::Result<Datagram> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_BUF as _;
    // SAFETY: a valid msghdr.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, RECV_FLAGS) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Datagram {
        len: n as usize,
        uid: sender_uid(&msg),
    })
}

/// Read up to `bufs.len()` queued datagrams with one `recvmmsg`, datagram
/// `i` into `bufs[i]`, each pushed to `out`; how many were read (fewer than
/// `bufs.len()`: the queue was empty). Each datagram's credentials are read
/// exactly as [`recv_one`] reads them.
pub(crate) fn recv_many(
    fd: BorrowedFd<'_>,
    bufs: &mut [Vec<u8>],
    cbufs: &mut [CmsgBuf],
    out: &mut Vec<Datagram>,
) -> io::Result<usize> {
    let count = bufs.len().min(cbufs.len());
    let mut iovs: Vec<libc::iovec> = bufs[..count]
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .zip(cbufs.iter_mut())
        .map(|(iov, cbuf)| {
            // SAFETY: mmsghdr is plain old data; its pointers outlive the call.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = cbuf.as_mut_ptr().cast();
            m.msg_hdr.msg_controllen = CMSG_BUF as _;
            m
        })
        .collect();
    // SAFETY: `count` initialised mmsghdrs.
    let r = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            count as libc::c_uint,
            RECV_FLAGS,
            std::ptr::null_mut(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let r = r as usize;
    for m in &msgs[..r] {
        out.push(Datagram {
            len: m.msg_len as usize,
            uid: sender_uid(&m.msg_hdr),
        });
    }
    Ok(r)
}
