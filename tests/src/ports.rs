//! Free loopback ports.
//!
//! Bind `127.0.0.1:0`, read the port the kernel chose, drop the listener. Another process can take the
//! port in between; [`crate::process`] retries a start whose child exits early, which covers that race.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use crate::HarnessError;

/// A loopback address whose port was free a moment ago.
pub fn free_loopback_addr() -> Result<SocketAddr, HarnessError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| HarnessError::io("binding 127.0.0.1:0 to find a free port", e))?;
    listener.local_addr().map_err(|e| HarnessError::io("reading the free port", e))
}
