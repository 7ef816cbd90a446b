//! A TCP proxy whose connections a test can cut or hold while it keeps listening: a dropped connection, as
//! a client of the gateway sees one, or a link that stops carrying anything without closing (a stalled
//! server, a congested network), on demand.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

use crate::HarnessError;
use crate::sync::lock;

/// Forwards every connection on a loopback port it bound itself to `upstream`, byte for byte.
/// [`CutProxy::cut`] closes every open connection; new ones are forwarded as before. [`CutProxy::hold`]
/// stops forwarding in both directions with every connection left open, until [`CutProxy::release`]
/// forwards what was held back. Dropping it stops it.
#[derive(Debug)]
pub struct CutProxy {
    addr: SocketAddr,
    open: Arc<Mutex<Vec<AbortHandle>>>,
    held: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl CutProxy {
    pub async fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.map_err(|e| HarnessError::io("binding the cut proxy", e))?;
        let addr = listener.local_addr().map_err(|e| HarnessError::io("reading the cut proxy's address", e))?;
        let open: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let connections = Arc::clone(&open);
        let (held, _) = watch::channel(false);
        let hold = held.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let forwarding = tokio::spawn(forward(client, upstream, hold.subscribe()));
                let mut open = lock(&connections);
                open.retain(|h| !h.is_finished());
                open.push(forwarding.abort_handle());
            }
        });
        Ok(Self { addr, open, held, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, for a gRPC client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `nats://ADDR`, for a NATS client.
    pub fn nats_url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Closes every connection open now (both sides see it closed); returns how many there were.
    pub fn cut(&self) -> usize {
        let mut open = lock(&self.open);
        let n = open.iter().filter(|h| !h.is_finished()).count();
        for h in open.drain(..) {
            h.abort();
        }
        n
    }

    /// Stops forwarding: what either side sends from now on is read and held back, and both sides see
    /// their connection open and silent.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Forwards again, what was held back first.
    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn forward(client: TcpStream, upstream: SocketAddr, held: watch::Receiver<bool>) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Aborting this task drops both sockets: each peer sees its connection closed.
    tokio::select! {
        () = pump(client_read, server_write, held.clone()) => {}
        () = pump(server_read, client_write, held) => {}
    }
}

/// Copies `from` to `to` until either ends, holding each chunk back while `held` says so.
async fn pump(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin, mut held: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if held.wait_for(|held| !*held).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
