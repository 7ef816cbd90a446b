//! A TCP proxy whose connections a test can cut while it keeps listening: a dropped connection, as a
//! client of the gateway sees one, on demand.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

use crate::HarnessError;
use crate::sync::lock;

/// Forwards every connection on a loopback port it bound itself to `upstream`, byte for byte.
/// [`CutProxy::cut`] closes every open connection; new ones are forwarded as before. Dropping it stops it.
#[derive(Debug)]
pub struct CutProxy {
    addr: SocketAddr,
    open: Arc<Mutex<Vec<AbortHandle>>>,
    task: JoinHandle<()>,
}

impl CutProxy {
    pub async fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.map_err(|e| HarnessError::io("binding the cut proxy", e))?;
        let addr = listener.local_addr().map_err(|e| HarnessError::io("reading the cut proxy's address", e))?;
        let open: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let connections = Arc::clone(&open);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let forwarding = tokio::spawn(forward(client, upstream));
                let mut open = lock(&connections);
                open.retain(|h| !h.is_finished());
                open.push(forwarding.abort_handle());
            }
        });
        Ok(Self { addr, open, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, for a gRPC client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn forward(mut client: TcpStream, upstream: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Aborting this task drops both sockets: each peer sees its connection closed.
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
