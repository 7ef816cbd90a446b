//! Network namespaces that the test creates itself, to cut one worker off from NATS, or one NATS node
//! together with its worker off from the rest of the cluster (issues 14 and 29, the fault campaign's
//! partitions).
//!
//! Layout of one namespace (every address is inside one /29 of 10.250.0.0/16 that exists only between this
//! namespace and the host, so no packet of a test ever leaves the machine; an `unreachable` route for the
//! /29 makes sure of it even while the links are being torn down):
//!
//! ```text
//!   host namespace                                   namespace `tsfc-<pid>-<n>`
//!   NATS nodes listen on  .1  ── veth pair "nats" ──  .2   the worker dials NATS from here
//!   gateways dial from    .5  ── veth pair "rpc"  ──  .6   the worker listens here (gRPC, /metrics)
//! ```
//!
//! A partition is the namespace end of the "nats" pair set down ([`NetNs::partition`]): the worker's packets
//! to NATS go nowhere and new connections fail at once (ENETUNREACH), while the gateways still reach the
//! worker over the "rpc" pair, which is what a worker that lost only its NATS link looks like. Healing sets
//! the link up again. (This kernel has neither the `netem` qdisc nor tc classifiers, and iptables is not
//! installed; a link down needs neither.)
//!
//! **A NATS node with its worker** (the campaign's "partition nats node + worker"): a second namespace of
//! the same layout runs one nats-server of the JetStream cluster next to one worker. That server listens
//! (client, monitoring and route ports) on the namespace end of its "nats" pair (`.2`,
//! [`NetNs::nats_ns_addr`]); the other servers listen on the host end of the *first* namespace's "nats"
//! pair, which this namespace reaches through a host route ([`NetNs::route_to`]: `<that .1>/32 via <own
//! .1>`; the host delivers it locally, no forwarding involved). So every route link between the inner
//! server and the others, every client link of the other workers and the gateways to it, and the inner
//! worker's links to the other servers cross this namespace's "nats" pair, and setting its namespace end
//! down cuts all of them at once, while the inner worker still reaches its own server: an address on a
//! link that is down stays a local address of the namespace (measured on this kernel: a TCP connect to it
//! from inside succeeds with the link down). The gateways still reach the inner worker over its "rpc" pair,
//! so it keeps being asked to write; the inner server, one of three, has no JetStream quorum, so the
//! worker's writes fail instead of being acknowledged into a minority, its leases expire, and the other
//! workers, on the two servers that elect new leaders, take its shards. Healing sets the link up; the
//! inner server routes to the others again (its configured routes are retried for ever) and catches up.
//! (The kernel drops the host route with the link; [`NetNs::heal`] adds it again.)
//!
//! Names are unique per process and per namespace (`tsfc-<pid>-<n>`, links `tf<pid>x<n>..`); stale ones of a
//! process that no longer runs (a killed test run) are removed by [`NetNs::create`]. [`Drop`] removes the
//! namespace, the host ends of the links and the route.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::HarnessError;

/// Prefix of every namespace this module creates.
const NS_PREFIX: &str = "tsfc-";
/// Prefix of every link this module creates.
const LINK_PREFIX: &str = "tf";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One namespace with its two veth pairs. See the module docs.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    /// Host end and namespace end of the pair that carries NATS traffic.
    nats_host_dev: String,
    nats_ns_dev: String,
    /// Host end of the pair that carries the gateways' calls to the worker.
    rpc_host_dev: String,
    /// `10.250.B.0/29`.
    block: Ipv4Addr,
    /// Host addresses routed over the "nats" pair ([`NetNs::route_to`]); the kernel drops such a route when
    /// the link goes down, so [`NetNs::heal`] adds them again.
    routes: Mutex<Vec<Ipv4Addr>>,
}

fn ip(args: &[&str]) -> Result<String, HarnessError> {
    let out = Command::new("ip").args(args).output().map_err(|e| HarnessError::io("running ip(8)", e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(HarnessError::io(
            format!("running `ip {}`", args.join(" ")),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        ))
    }
}

/// Whether `ip -o -4 addr show` output names an address of the /29 `block`.
fn block_in_use(block: Ipv4Addr, addrs: &str) -> bool {
    (0..8u32).any(|k| addrs.contains(&format!(" {}/", Ipv4Addr::from(u32::from(block) + k))))
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name made by this module (`tsfc-<pid>-<n>` or `tf<pid>x<n>…`), if it is one.
fn owner_pid(name: &str) -> Option<u32> {
    if let Some(rest) = name.strip_prefix(NS_PREFIX) {
        return rest.split('-').next()?.parse().ok();
    }
    let rest = name.strip_prefix(LINK_PREFIX)?;
    rest.split('x').next()?.parse().ok()
}

impl NetNs {
    /// Creates the namespace, the two veth pairs and their addresses. Fails (with what `ip` said) where the
    /// process may not: not root, no CAP_NET_ADMIN, no `ip` binary.
    pub fn create() -> Result<Self, HarnessError> {
        Self::remove_stale();
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NS_PREFIX}{pid}-{n}");
        let dev = |which: &str| format!("{LINK_PREFIX}{pid}x{n}{which}");
        let block = Self::free_block(pid, n)?;
        let addr = |last: u32| Ipv4Addr::from(u32::from(block) + last).to_string();
        let ns = Self {
            name: name.clone(),
            nats_host_dev: dev("n0"),
            nats_ns_dev: dev("n1"),
            rpc_host_dev: dev("r0"),
            block,
            routes: Mutex::new(Vec::new()),
        };
        let rpc_ns_dev = dev("r1");
        // From here on, Drop cleans up whatever was made.
        ip(&["netns", "add", &name])?;
        ip(&["route", "add", "unreachable", &format!("{}/29", addr(0))])?;
        for (host, inner, host_addr, ns_addr) in
            [(&ns.nats_host_dev, &ns.nats_ns_dev, addr(1), addr(2)), (&ns.rpc_host_dev, &rpc_ns_dev, addr(5), addr(6))]
        {
            ip(&["link", "add", host, "type", "veth", "peer", "name", inner])?;
            ip(&["link", "set", inner, "netns", &name])?;
            ip(&["addr", "add", &format!("{host_addr}/30"), "dev", host])?;
            ip(&["link", "set", host, "up"])?;
            ip(&["-n", &name, "addr", "add", &format!("{ns_addr}/30"), "dev", inner])?;
            ip(&["-n", &name, "link", "set", inner, "up"])?;
        }
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A /29 of 10.250.0.0/16 no interface of the host uses yet.
    fn free_block(pid: u32, n: u32) -> Result<Ipv4Addr, HarnessError> {
        let used = ip(&["-o", "-4", "addr", "show"])?;
        let start = (pid.wrapping_mul(31).wrapping_add(n)) % 8192;
        for k in 0..8192u32 {
            let index = (start + k) % 8192;
            let block = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 250, 0, 0)) + index * 8);
            if !block_in_use(block, &used) {
                return Ok(block);
            }
        }
        Err(HarnessError::io("choosing addresses", std::io::Error::other("every /29 of 10.250.0.0/16 is in use")))
    }

    /// Removes namespaces and links left by test processes that no longer run (a run killed before its
    /// Drop). Those of running processes are left alone.
    pub fn remove_stale() {
        if let Ok(list) = ip(&["netns", "list"]) {
            for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
                if owner_pid(name).is_some_and(|pid| !pid_alive(pid)) {
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
        if let Ok(links) = ip(&["-o", "link", "show"]) {
            for link in links.lines().filter_map(|l| l.split(':').nth(1)) {
                let link = link.trim().split('@').next().unwrap_or_default();
                if owner_pid(link).is_some_and(|pid| !pid_alive(pid)) {
                    let _ = ip(&["link", "del", link]);
                }
            }
        }
        // Routes of stale runs: an unreachable /29 in 10.250/16 whose block no link of ours uses any more.
        if let (Ok(routes), Ok(addrs)) =
            (ip(&["route", "show", "type", "unreachable"]), ip(&["-o", "-4", "addr", "show"]))
        {
            for route in routes.lines() {
                let Some(prefix) = route.split_whitespace().nth(1) else { continue };
                if let Some(net) = prefix.strip_suffix("/29").filter(|p| p.starts_with("10.250."))
                    && let Ok(block) = net.parse::<Ipv4Addr>()
                    && !block_in_use(block, &addrs)
                {
                    let _ = ip(&["route", "del", "unreachable", prefix]);
                }
            }
        }
    }

    fn host(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.block) + u32::from(last))
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host-side address the NATS nodes listen on (reachable from the host and, over the "nats" pair,
    /// from the namespace).
    pub fn nats_host(&self) -> Ipv4Addr {
        self.host(1)
    }

    /// The namespace end of the "nats" pair: where a nats-server inside the namespace listens (reachable from
    /// the host, and from inside even while the link is down).
    pub fn nats_ns_addr(&self) -> Ipv4Addr {
        self.host(2)
    }

    /// Routes `addr` (a host address, e.g. another namespace's [`NetNs::nats_host`]) from inside this
    /// namespace over its own "nats" pair, so the link cut of [`NetNs::partition`] cuts that path too. The
    /// route goes with the namespace.
    pub fn route_to(&self, addr: Ipv4Addr) -> Result<(), HarnessError> {
        self.add_route(addr)?;
        self.routes.lock().map_err(|_| poisoned())?.push(addr);
        Ok(())
    }

    fn add_route(&self, addr: Ipv4Addr) -> Result<(), HarnessError> {
        let via = self.nats_host().to_string();
        ip(&["-n", &self.name, "route", "replace", &format!("{addr}/32"), "via", &via]).map(drop)
    }

    /// The namespace-side address the worker inside listens on (reached from the host over the "rpc" pair).
    pub fn worker_host(&self) -> Ipv4Addr {
        self.host(6)
    }

    /// A command that runs `program` inside the namespace. `ip netns exec` execs it in place (no fork), so the
    /// child's pid is the program's.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Cuts the namespace off from NATS: the namespace end of the "nats" pair goes down.
    pub fn partition(&self) -> Result<(), HarnessError> {
        ip(&["-n", &self.name, "link", "set", &self.nats_ns_dev, "down"]).map(drop)
    }

    /// Undoes [`NetNs::partition`]: the link up, and the routes of [`NetNs::route_to`] again (the kernel
    /// removed them with the link; without them the namespace would stay cut off from those addresses).
    pub fn heal(&self) -> Result<(), HarnessError> {
        ip(&["-n", &self.name, "link", "set", &self.nats_ns_dev, "up"])?;
        let routes = self.routes.lock().map_err(|_| poisoned())?.clone();
        for addr in routes {
            self.add_route(addr)?;
        }
        Ok(())
    }
}

fn poisoned() -> HarnessError {
    HarnessError::io("the namespace's route list", std::io::Error::other("poisoned by a panic"))
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace deletes the namespace ends, and with them the pairs; the host ends go too,
        // but say so in case the namespace was half made.
        let _ = ip(&["netns", "del", &self.name]);
        for dev in [&self.nats_host_dev, &self.rpc_host_dev] {
            let _ = ip(&["link", "del", dev]);
        }
        let _ = ip(&["route", "del", "unreachable", &format!("{}/29", self.block)]);
    }
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn names_carry_their_pid() {
        assert_eq!(owner_pid("tsfc-123-0"), Some(123));
        assert_eq!(owner_pid("tf4567x1n0"), Some(4567));
        assert_eq!(owner_pid("eth0"), None);
        assert_eq!(owner_pid("tsfc-x"), None);
    }
}
