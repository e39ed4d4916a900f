//! The address guard (docs/delivery.md): which addresses courier may connect to
//! for an endpoint whose URL it did not choose. An app that sends to its
//! customers' URLs hands courier untrusted input; without the guard, a URL
//! naming `169.254.169.254` or a name resolving to `10.0.0.5` makes courier
//! a proxy into the pod's network (SSRF). Pure: the connector asks it of
//! every address it would dial, after DNS (`deliver::guard`).
//!
//! Refused: every range of IANA's special-purpose registries that is not
//! globally reachable, and the cloud addresses a pod can reach that are
//! (Azure's 168.63.129.16); an IPv6 address that embeds an IPv4 one
//! (mapped, NAT64, 6to4, IPv4-compatible) is judged by the IPv4 address.
//! An operator opens exact ranges with `endpoints.allow_cidrs`.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guard {
    /// Ranges let through whatever the defaults say.
    allow: Vec<IpNet>,
}

impl Guard {
    pub fn new(allow: Vec<IpNet>) -> Guard {
        Guard { allow }
    }

    /// Whether courier may connect to `ip`. An embedded IPv4 address is
    /// looked up in `allow` as itself too, so that `127.0.0.0/8` opens
    /// `::ffff:127.0.0.1`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let opened = |ip: IpAddr| self.allow.iter().any(|net| net.contains(&ip));
        if opened(ip) {
            return true;
        }
        match ip {
            IpAddr::V4(v4) => !refused_v4(v4),
            IpAddr::V6(v6) => match embedded_v4(v6) {
                Some(v4) => opened(IpAddr::V4(v4)) || !refused_v4(v4),
                None => !refused_v6(v6),
            },
        }
    }
}

/// The address a url's host names when it is an IP literal (`[v6]` without
/// its brackets), read as hyper-util's connector reads it: such a host
/// skips DNS, so the guard must judge it before a connection is tried.
pub fn literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

fn refused_v4(a: Ipv4Addr) -> bool {
    let [o0, o1, o2, _] = a.octets();
    o0 == 0 // "this network", 0.0.0.0 included
        || a.is_loopback()
        || a.is_private() // 10/8, 172.16/12, 192.168/16
        || a.is_link_local() // 169.254/16: the cloud metadata address
        || (o0 == 100 && (o1 & 0xc0) == 64) // CGNAT 100.64/10
        || (o0 == 192 && o1 == 0 && o2 == 0) // IETF protocol assignments
        || (o0 == 192 && o1 == 0 && o2 == 2) // documentation
        || (o0 == 192 && o1 == 88 && o2 == 99) // 6to4 relay anycast
        || (o0 == 198 && (o1 & 0xfe) == 18) // benchmarking 198.18/15
        || (o0 == 198 && o1 == 51 && o2 == 100) // documentation
        || (o0 == 203 && o1 == 0 && o2 == 113) // documentation
        || a.is_multicast() // 224/4
        || o0 >= 240 // reserved 240/4, the broadcast address included
        || a == Ipv4Addr::new(168, 63, 129, 16) // Azure's host services
}

fn refused_v6(a: Ipv6Addr) -> bool {
    let s = a.segments();
    a.is_unspecified()
        || a.is_loopback()
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7, fd00:ec2::254 included
        || a.is_multicast() // ff00::/8
        || (s[0] == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] == 0) // discard 100::/64
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x2001 && s[1] < 0x0200) // IETF protocol assignments 2001::/23, Teredo included
        || (s[0] == 0x0064 && s[1] == 0xff9b && s[2] == 0x0001) // local-use NAT64 64:ff9b:1::/48
        || (s[0] == 0x3fff && s[1] < 0x1000) // documentation 3fff::/20
}

/// The IPv4 address an IPv6 one stands for: mapped `::ffff:0:0/96`,
/// NAT64 `64:ff9b::/96`, 6to4 `2002::/16`, IPv4-compatible `::/96`
/// (deprecated; `::` and `::1` are IPv6's own).
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let low = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
        return Some(low());
    }
    if s[..6] == [0x0064, 0xff9b, 0, 0, 0, 0] {
        return Some(low());
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    if s[..6] == [0; 6] && !a.is_unspecified() && !a.is_loopback() {
        return Some(low());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_literal_host_is_read_as_the_connector_reads_it() {
        assert_eq!(literal("10.0.0.1"), Some(ip("10.0.0.1")));
        assert_eq!(literal("[::1]"), Some(ip("::1")));
        assert_eq!(literal("hooks.example"), None);
        assert_eq!(literal("127.1"), None, "a short form goes to DNS");
    }

    #[test]
    fn private_and_special_addresses_are_refused_by_default() {
        let guard = Guard::default();
        for refused in [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "172.16.5.4",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "168.63.129.16",
            "::",
            "::1",
            "fe80::1",
            "fec0::1",
            "fc00::1",
            "fd00:ec2::254",
            "ff02::1",
            "100::1",
            "2001:db8::1",
            "2001::1",
            "64:ff9b:1::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "::127.0.0.1",
            "::10.0.0.1",
        ] {
            assert!(!guard.allows(ip(refused)), "{refused} must be refused");
        }
    }

    #[test]
    fn public_addresses_and_their_ipv6_forms_pass() {
        let guard = Guard::default();
        for allowed in [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "169.253.0.1",
            "168.63.129.17",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(guard.allows(ip(allowed)), "{allowed} must pass");
        }
    }

    #[test]
    fn allowed_ranges_open_exactly_themselves_and_their_embedded_forms() {
        let nets = ["127.0.0.0/8", "10.20.0.0/16", "fd00:1::/64"];
        let guard = Guard::new(nets.iter().map(|n| n.parse().expect("cidr")).collect());
        for opened in [
            "127.0.0.1",
            "10.20.3.4",
            "fd00:1::5",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
        ] {
            assert!(guard.allows(ip(opened)), "{opened} is opened");
        }
        for still in ["10.21.0.1", "169.254.169.254", "fd00:2::5", "::1"] {
            assert!(!guard.allows(ip(still)), "{still} stays refused");
        }
    }
}
