//! How a server reports where it listens, once every listener is bound and before it serves: one
//! `turnstile: listening NAME=ADDR` line per listener on stdout and, with `--ready-file`, the same as one
//! JSON object. A stable, machine-readable format: docs/TESTING.md and docs/decisions/0007-bound-addresses.md.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use tokio::net::TcpListener;

use crate::NodeError;

/// One listener of this process: its name (`grpc`, `worker`, `http`) and the address it is bound to.
pub type Bound = (&'static str, SocketAddr);

/// Binds first so a busy port fails before anything else starts, with the fix in the message.
pub(crate) async fn bind(listen: &str) -> Result<(TcpListener, SocketAddr), NodeError> {
    let listener = match TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            return Err(NodeError::ListenInUse { listen: listen.to_owned() });
        }
        Err(cause) => return Err(NodeError::Listen { listen: listen.to_owned(), cause }),
    };
    let local = listener.local_addr().map_err(NodeError::LocalAddr)?;
    Ok((listener, local))
}

/// `name` bound at `listener` and, when they are served, the ops HTTP endpoints at `http`.
pub(crate) fn bound_with_http(name: &'static str, listener: SocketAddr, http: Option<SocketAddr>) -> Vec<Bound> {
    let mut bound = vec![(name, listener)];
    bound.extend(http.map(|addr| ("http", addr)));
    bound
}

/// The stdout line that reports one bound listener: `turnstile: listening NAME=ADDR`, ADDR as bound
/// (`127.0.0.1:40123`, `[::1]:40123`, a wildcard bind as `0.0.0.0:40123`).
pub fn listening_line((name, addr): Bound) -> String {
    format!("turnstile: listening {name}={addr}")
}

/// The `--ready-file` object: `{"pid":N,"NAME":"ADDR",…}` with one member per listener plus `fields`.
pub fn ready_json(pid: u32, bound: &[Bound], fields: &[(&str, String)]) -> String {
    let mut object = serde_json::Map::new();
    object.insert("pid".to_owned(), pid.into());
    for (name, addr) in bound {
        object.insert((*name).to_owned(), addr.to_string().into());
    }
    for (name, value) in fields {
        object.insert((*name).to_owned(), value.clone().into());
    }
    serde_json::Value::Object(object).to_string()
}

/// Reports every bound address: one [`listening_line`] per listener on stdout, and with `ready_file` the
/// [`ready_json`] object (plus `fields`), written to a temporary file beside it and renamed over it, so a
/// reader sees all of it or nothing.
pub(crate) fn report_bound(
    bound: &[Bound],
    fields: &[(&str, String)],
    ready_file: Option<&Path>,
) -> Result<(), NodeError> {
    let mut out = std::io::stdout().lock();
    for listener in bound {
        writeln!(out, "{}", listening_line(*listener)).map_err(NodeError::Stdout)?;
    }
    out.flush().map_err(NodeError::Stdout)?;
    let Some(path) = ready_file else { return Ok(()) };
    let Some(name) = path.file_name() else {
        return Err(NodeError::ReadyFileName { path: path.to_path_buf() });
    };
    let pid = std::process::id();
    let temporary = path.with_file_name(format!(".{}.{pid}.tmp", name.to_string_lossy()));
    std::fs::write(&temporary, ready_json(pid, bound, fields) + "\n")
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|cause| NodeError::ReadyFile { path: path.to_path_buf(), cause })
}

/// The URL clients use for `addr`: a wildcard bind is reached over loopback.
pub fn client_url(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() { std::net::Ipv4Addr::LOCALHOST.into() } else { addr.ip() };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// [`client_url`] with `https://` when the server speaks TLS.
pub fn client_url_for(addr: SocketAddr, tls: bool) -> String {
    let url = client_url(addr);
    if tls { url.replacen("http://", "https://", 1) } else { url }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_busy_port_says_how_to_pick_another() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = bind(&addr).await.unwrap_err();
        assert_eq!(err.to_string(), format!("{addr} is in use; pass --listen 127.0.0.1:0 or another port"));
    }

    #[test]
    fn bound_addresses_are_reported_in_the_documented_formats() {
        let grpc: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        let http: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(listening_line(("grpc", grpc)), "turnstile: listening grpc=127.0.0.1:40123");
        assert_eq!(listening_line(("http", http)), "turnstile: listening http=[::1]:9");
        let json: serde_json::Value =
            serde_json::from_str(&ready_json(7, &[("worker", grpc)], &[("advertise", "10.0.0.5:7501".into())]))
                .unwrap();
        assert_eq!(json, serde_json::json!({"pid": 7, "worker": "127.0.0.1:40123", "advertise": "10.0.0.5:7501"}));
    }

    #[test]
    fn the_ready_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready.json");
        std::fs::write(&path, "stale").unwrap();
        let grpc: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        report_bound(&[("grpc", grpc)], &[], Some(&path)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(json["grpc"], "127.0.0.1:40123");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left behind");
    }

    #[test]
    fn a_ready_file_path_without_a_file_name_is_refused() {
        let grpc: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        let err = report_bound(&[("grpc", grpc)], &[], Some(Path::new("/"))).unwrap_err();
        assert_eq!(err.to_string(), "--ready-file / names no file");
    }

    #[test]
    fn wildcard_binds_are_reached_over_loopback() {
        assert_eq!(client_url("0.0.0.0:7400".parse().unwrap()), "http://127.0.0.1:7400");
        assert_eq!(client_url("127.0.0.1:9".parse().unwrap()), "http://127.0.0.1:9");
        assert_eq!(client_url_for("127.0.0.1:9".parse().unwrap(), true), "https://127.0.0.1:9");
    }
}
