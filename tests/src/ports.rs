//! The addresses a started process bound, read back from what it reports.
//!
//! Every process the harness starts binds port 0 and says which port it got, so no port is ever picked
//! here, released, and bound later by the child, a window in which another process could take it
//! (docs/decisions/0007-bound-addresses.md):
//! - `turnstile dev|gateway|worker --ready-file FILE` writes `{"pid":N,"grpc":"ADDR","http":"ADDR"}` (a
//!   worker: `"worker"`, `"id"`, `"advertise"`) once every listener is bound, replacing FILE atomically;
//! - `nats-server --ports_file_dir DIR` writes `DIR/<executable>_<pid>.ports`,
//!   `{"nats":["nats://ADDR"],"monitoring":["http://ADDR"],"cluster":["nats://ADDR"]}`, once it listens.
//!
//! Both readers answer `None` until the file is there, whole and from the given process, so a caller
//! polls them with [`crate::process::ChildProcess::wait_for`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use serde_json::Value;

use crate::HarnessError;

/// What `turnstile --ready-file` reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnstileReady {
    /// The public API (`dev`, `gateway`).
    pub grpc: Option<SocketAddr>,
    /// The internal API of a `worker`.
    pub worker: Option<SocketAddr>,
    /// `/metrics`, `/healthz`, `/readyz`, when served.
    pub http: Option<SocketAddr>,
    /// The address a worker put in its heartbeat and shard leases.
    pub advertise: Option<String>,
}

/// The ready file at `path` if process `pid` has written it.
pub fn read_turnstile_ready(path: &Path, pid: u32) -> Option<TurnstileReady> {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    if json.get("pid")?.as_u64()? != u64::from(pid) {
        return None;
    }
    let addr = |key: &str| json.get(key).and_then(Value::as_str).and_then(|a| a.parse().ok());
    Some(TurnstileReady {
        grpc: addr("grpc"),
        worker: addr("worker"),
        http: addr("http"),
        advertise: json.get("advertise").and_then(Value::as_str).map(str::to_owned),
    })
}

/// What `nats-server --ports_file_dir` reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatsPorts {
    pub client: SocketAddr,
    pub monitor: SocketAddr,
    /// The route (cluster) listener, for a clustered server.
    pub cluster: Option<SocketAddr>,
}

/// The ports file process `pid` wrote into `dir`, if it has (its name starts with the executable's).
pub fn read_nats_ports(dir: &Path, pid: u32) -> Option<NatsPorts> {
    let suffix = format!("_{pid}.ports");
    let file = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|entry| entry.file_name().to_string_lossy().ends_with(&suffix))?;
    // nats-server writes the file in place: a partial read does not parse and is read again later.
    let json: Value = serde_json::from_str(&std::fs::read_to_string(file.path()).ok()?).ok()?;
    let first = |key: &str| -> Option<SocketAddr> {
        let url = json.get(key)?.as_array()?.first()?.as_str()?;
        url.split_once("://").map_or(url, |(_, rest)| rest).parse().ok()
    };
    Some(NatsPorts { client: first("nats")?, monitor: first("monitoring")?, cluster: first("cluster") })
}

/// A loopback port that nobody listens on while this value lives: it holds the port bound (without
/// `SO_REUSEADDR`) and never listens, so a connection there is refused and no other process can bind it.
/// For tests of "nothing listens at that address".
#[derive(Debug)]
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl ClosedPort {
    pub fn new() -> Result<Self, HarnessError> {
        let socket = tokio::net::TcpSocket::new_v4().map_err(|e| HarnessError::io("creating a socket", e))?;
        socket
            .bind((Ipv4Addr::LOCALHOST, 0).into())
            .map_err(|e| HarnessError::io("binding 127.0.0.1:0 without listening", e))?;
        let addr = socket.local_addr().map_err(|e| HarnessError::io("reading the bound port", e))?;
        Ok(Self { _socket: socket, addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_file_is_read_only_whole_and_from_its_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ready.json");
        assert_eq!(read_turnstile_ready(&path, 7), None, "not there yet");
        std::fs::write(&path, r#"{"pid":7,"worker":"127.0.0.1:4"#).unwrap();
        assert_eq!(read_turnstile_ready(&path, 7), None, "partial");
        std::fs::write(&path, r#"{"pid":7,"worker":"127.0.0.1:4","http":"[::1]:5","advertise":"h:4","id":"w1"}"#)
            .unwrap();
        assert_eq!(read_turnstile_ready(&path, 8), None, "another process's");
        let ready = read_turnstile_ready(&path, 7).unwrap();
        assert_eq!(ready.worker, Some("127.0.0.1:4".parse().unwrap()));
        assert_eq!((ready.grpc, ready.http), (None, Some("[::1]:5".parse().unwrap())));
        assert_eq!(ready.advertise.as_deref(), Some("h:4"));
    }

    #[test]
    fn a_ports_file_is_found_by_pid() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_nats_ports(dir.path(), 42), None);
        let ports = r#"{"nats":["nats://127.0.0.1:44565"],"monitoring":["http://127.0.0.1:38191"],"cluster":["nats://127.0.0.1:35111"]}"#;
        std::fs::write(dir.path().join("nats-server_41.ports"), ports).unwrap();
        assert_eq!(read_nats_ports(dir.path(), 42), None, "another process's");
        std::fs::write(dir.path().join("nats-server-2.15_42.ports"), ports).unwrap();
        let got = read_nats_ports(dir.path(), 42).unwrap();
        assert_eq!(got.client, "127.0.0.1:44565".parse().unwrap());
        assert_eq!(got.monitor, "127.0.0.1:38191".parse().unwrap());
        assert_eq!(got.cluster, Some("127.0.0.1:35111".parse().unwrap()));
    }

    #[tokio::test]
    async fn a_closed_port_refuses_connections() {
        let port = ClosedPort::new().unwrap();
        let err = tokio::net::TcpStream::connect(port.addr()).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
