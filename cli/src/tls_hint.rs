//! A client command to an `http://` address that fails at the transport may have reached a server that
//! speaks TLS: the failure then reads `INTERNAL: h2 protocol error` or `CANCELLED: operation was
//! canceled`, which names neither TLS nor the fix. One probe tells: a TLS server answers the plain HTTP/2
//! preface with a TLS alert record.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The first bytes a plain HTTP/2 client sends.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// `result` as it is, or, when it failed at the transport on an `http://` address that a TLS server
/// listens on, an error that says so and how to fix it.
pub(crate) async fn explain<T>(addr: &str, result: anyhow::Result<T>) -> anyhow::Result<T> {
    let Err(err) = result else { return result };
    let Some(authority) = addr.strip_prefix("http://").map(|rest| rest.split('/').next().unwrap_or(rest)) else {
        return Err(err);
    };
    if !at_transport(&err) || !speaks_tls(authority).await {
        return Err(err);
    }
    Err(anyhow::anyhow!(
        "the server at {authority} speaks TLS, and --addr {addr} is plain http://: use --addr https://{authority} \
         with --ca FILE (the CA that signed its certificate)"
    ))
}

/// Whether `err` is a failure of the connection rather than an answer of the application.
fn at_transport(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<tonic::transport::Error>().is_some()
            || e.downcast_ref::<tonic::Status>().is_some_and(|s| {
                use tonic::Code::{Cancelled, Internal, Unavailable, Unknown};
                matches!(s.code(), Cancelled | Internal | Unavailable | Unknown)
            })
    })
}

/// Whether the server at `authority` answers the HTTP/2 preface with a TLS alert record (content type 21,
/// protocol version 3.x), within 2 s.
async fn speaks_tls(authority: &str) -> bool {
    let probe = async {
        let mut stream = TcpStream::connect(authority).await.ok()?;
        stream.write_all(PREFACE).await.ok()?;
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await.ok()?;
        Some(head)
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Some([0x15, 0x03])))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::net::TcpListener;

    use super::*;

    /// A listener that answers anything with `reply` and closes.
    async fn answering(reply: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; PREFACE.len()];
            let _ = s.read_exact(&mut buf).await;
            let _ = s.write_all(reply).await;
        });
        addr
    }

    #[tokio::test]
    async fn a_transport_failure_against_a_tls_server_says_to_use_https() {
        // rustls's answer to a plain HTTP/2 preface: a fatal decode_error alert.
        let tls = answering(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]).await;
        let addr = format!("http://{tls}");
        let failed: anyhow::Result<()> = Err(tonic::Status::internal("h2 protocol error: http2 error").into());
        let err = explain(&addr, failed).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "the server at {tls} speaks TLS, and --addr {addr} is plain http://: use --addr https://{tls} with \
                 --ca FILE (the CA that signed its certificate)"
            )
        );
    }

    #[tokio::test]
    async fn other_failures_stay_as_they_were() {
        // An HTTP/2 server's SETTINGS frame is no TLS record.
        let h2 = answering(&[0x00, 0x00, 0x00, 0x04, 0x00]).await;
        let failed: anyhow::Result<()> = Err(tonic::Status::internal("h2 protocol error").into());
        let err = explain(&format!("http://{h2}"), failed).await.unwrap_err();
        assert_eq!(err.downcast_ref::<tonic::Status>().unwrap().code(), tonic::Code::Internal);
        // An answer of the application is never probed for.
        let failed: anyhow::Result<()> = Err(tonic::Status::not_found("session default/x does not exist").into());
        let err = explain("http://127.0.0.1:1", failed).await.unwrap_err();
        assert_eq!(err.downcast_ref::<tonic::Status>().unwrap().code(), tonic::Code::NotFound);
    }
}
