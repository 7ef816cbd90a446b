//! Where a tenant may make the cluster send requests: the one rule for URLs a tenant names (webhooks
//! registered at run time, SPEC §21). A URL that resolves to a loopback, private, link-local (cloud
//! metadata services live there: 169.254.169.254, fd00:ec2::254), carrier-grade NAT (Alibaba's metadata
//! service, 100.100.100.200), unspecified, broadcast or multicast address is refused unless the operator
//! allows internal targets: otherwise a tenant could make the cluster's nodes POST into their own network.
//!
//! ```
//! use std::net::IpAddr;
//! use turnstile_ops::egress::is_internal;
//!
//! for internal in ["127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "fd00:ec2::254", "::ffff:192.168.0.1"] {
//!     assert!(is_internal(internal.parse::<IpAddr>().unwrap()), "{internal}");
//! }
//! assert!(!is_internal("93.184.215.14".parse::<IpAddr>().unwrap()));
//! ```

use std::net::{IpAddr, Ipv4Addr};

/// Why a URL may not be a target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error("{url:?} is not an http:// or https:// URL with a host")]
    NotHttp { url: String },
    #[error("the host {host:?} does not resolve: {detail}")]
    Unresolved { host: String, detail: String },
    #[error(
        "{host:?} resolves to {addr}, a loopback, private, link-local or metadata address; use a public address, or \
         let the operator allow internal targets ([webhooks] allow_private = true)"
    )]
    Internal { host: String, addr: IpAddr },
}

/// Whether `ip` is an address a tenant's URL may not reach (see the module doc).
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal_v4(v4);
            }
            let first = v6.segments()[0];
            // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
            if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [.., a, b, c, d] = v6.octets();
                return is_internal_v4(Ipv4Addr::new(a, b, c, d));
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (first & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated, still routed internally)
        }
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // carrier-grade NAT 100.64/10
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments 192.0.0/24
        || (a == 198 && (b == 18 || b == 19)) // benchmarking 198.18/15
        || a >= 240 // reserved
}

/// Checks `url` as a target: `http`/`https` with a host, and (unless `allow_internal`) every address the
/// host resolves to is public. Resolves through the system resolver (an IP literal needs none).
pub async fn check_url(url: &str, allow_internal: bool) -> Result<url::Url, EgressError> {
    let parsed = url::Url::parse(url).map_err(|_| EgressError::NotHttp { url: url.to_owned() })?;
    let host = match (parsed.scheme(), parsed.host()) {
        ("http" | "https", Some(host)) => host,
        _ => return Err(EgressError::NotHttp { url: url.to_owned() }),
    };
    if allow_internal {
        return Ok(parsed.clone());
    }
    let port = parsed.port_or_known_default().unwrap_or(80);
    let (name, addrs): (String, Vec<IpAddr>) = match host {
        url::Host::Ipv4(ip) => (ip.to_string(), vec![IpAddr::V4(ip)]),
        url::Host::Ipv6(ip) => (ip.to_string(), vec![IpAddr::V6(ip)]),
        url::Host::Domain(name) => {
            let found = tokio::net::lookup_host((name, port))
                .await
                .map_err(|e| EgressError::Unresolved { host: name.to_owned(), detail: e.to_string() })?;
            (name.to_owned(), found.map(|a| a.ip()).collect())
        }
    };
    if addrs.is_empty() {
        return Err(EgressError::Unresolved { host: name, detail: "no address".into() });
    }
    if let Some(addr) = addrs.into_iter().find(|a| is_internal(*a)) {
        return Err(EgressError::Internal { host: name, addr });
    }
    Ok(parsed)
}

/// Checks `url` without resolving anything: a URL whose host is an internal IP literal is refused (a name
/// is left to the resolver, which must drop internal addresses itself).
pub fn check_literal(url: &str) -> Result<(), EgressError> {
    let parsed = url::Url::parse(url).map_err(|_| EgressError::NotHttp { url: url.to_owned() })?;
    let addr = match parsed.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
        Some(url::Host::Domain(_)) => return Ok(()),
        None => return Err(EgressError::NotHttp { url: url.to_owned() }),
    };
    if is_internal(addr) { Err(EgressError::Internal { host: addr.to_string(), addr }) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_and_public_addresses_are_told_apart() {
        for internal in [
            "127.0.0.1",
            "127.8.9.10",
            "0.0.0.0",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "255.255.255.255",
            "224.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(is_internal(internal.parse().unwrap()), "{internal} is internal");
        }
        for public in ["8.8.8.8", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(!is_internal(public.parse().unwrap()), "{public} is public");
        }
    }

    #[tokio::test]
    async fn urls_are_checked_by_scheme_and_by_every_address_they_name() {
        assert!(matches!(check_url("ftp://example.com/x", true).await, Err(EgressError::NotHttp { .. })));
        assert!(matches!(check_url("not a url", true).await, Err(EgressError::NotHttp { .. })));
        let loopback = check_url("http://127.0.0.1:9/hook", false).await.unwrap_err();
        assert_eq!(loopback, EgressError::Internal { host: "127.0.0.1".into(), addr: "127.0.0.1".parse().unwrap() });
        assert!(matches!(check_url("http://[::1]/", false).await, Err(EgressError::Internal { .. })));
        assert!(matches!(check_url("http://localhost:8080/", false).await, Err(EgressError::Internal { .. })));
        assert!(check_url("http://127.0.0.1:9/hook", true).await.is_ok(), "allowed by the operator");
        assert!(check_url("https://93.184.215.14/hook", false).await.is_ok(), "a public literal needs no DNS");
        assert!(matches!(check_literal("http://10.0.0.1/"), Err(EgressError::Internal { .. })));
        assert_eq!(check_literal("http://hooks.example.com/"), Ok(()), "a name is the resolver's to check");
    }
}
