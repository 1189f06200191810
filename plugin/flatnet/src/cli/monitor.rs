//! `flatnet monitor`: one line per packet NetworkPolicy drops, as the
//! datapath reports them in its `POLICY_EVENTS` ring buffer: when, which
//! pod (its addresses and host veth, found by the event's counter slot),
//! which direction, the peer, protocol and port, and why.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use flatnet_common::{
    POLICY_DIR_INGRESS, POLICY_REASON_EXCEPT, POLICY_REASON_NO_PREFIX, POLICY_REASON_PORT,
    PolicyEvent, action,
};
use serde::Serialize;

use crate::error::{Error, Result};
use flatnet_datapath::bpf::Datapath;

/// How long the reader sleeps when the buffer is empty.
const POLL: Duration = Duration::from_millis(50);
/// How often the slot -> pod table is read again (pods come and go, and a
/// slot may be a new pod's).
const POD_TABLE_AGE: Duration = Duration::from_secs(2);

/// A pod as the monitor names it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PodName {
    pub addresses: Vec<IpAddr>,
    pub host_veth: Option<String>,
    pub host_ifindex: u32,
}

/// One dropped packet, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct Drop {
    /// Wall-clock time of the drop, RFC 3339 (UTC).
    pub time: String,
    /// The kernel's CLOCK_MONOTONIC at the drop, in nanoseconds.
    pub timestamp_ns: u64,
    pub network: String,
    pub slot: u32,
    /// None when no pod holds the slot any more.
    pub pod: Option<PodName>,
    /// "ingress" or "egress".
    pub direction: &'static str,
    /// The far side: the source of what came in, the destination of what
    /// went out.
    pub peer: IpAddr,
    pub protocol: String,
    pub protocol_number: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// 0 for protocols without ports.
    pub src_port: u16,
    pub dst_port: u16,
    /// "no-matching-prefix", "port-not-allowed" or "except".
    pub reason: &'static str,
    /// The packet's length.
    pub bytes: u32,
}

/// The name of a `POLICY_REASON_*`.
pub fn reason_name(reason: u8) -> &'static str {
    match reason {
        POLICY_REASON_NO_PREFIX => "no-matching-prefix",
        POLICY_REASON_PORT => "port-not-allowed",
        POLICY_REASON_EXCEPT => "except",
        _ => "unknown",
    }
}

fn protocol_name(protocol: u8) -> String {
    match protocol {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        other => format!("proto-{other}"),
    }
}

fn address(family: u8, bytes: [u8; 16]) -> IpAddr {
    if family == 4 {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(bytes))
    }
}

/// Nanoseconds of `clock` now.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; clock_gettime cannot fail for these clocks.
    unsafe { libc::clock_gettime(clock, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// RFC 3339 UTC with microseconds for `ns` since the epoch.
pub fn rfc3339(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let micros = (ns % 1_000_000_000) / 1_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Counter slot -> pod, read from `HOST_VETHS` and `ENDPOINTS_*`.
fn pod_table(datapath: &Datapath) -> Result<BTreeMap<u32, PodName>> {
    let mut addresses: BTreeMap<u32, Vec<IpAddr>> = BTreeMap::new();
    for (ip, endpoint) in datapath.all_endpoints()? {
        addresses.entry(endpoint.host_ifindex).or_default().push(ip);
    }
    let mut table = BTreeMap::new();
    for (ifindex, endpoint) in datapath.host_veths()? {
        let mut pod_addresses = addresses.remove(&ifindex).unwrap_or_default();
        pod_addresses.sort();
        table.insert(
            endpoint.counter_slot,
            PodName {
                addresses: pod_addresses,
                host_veth: flatnet_datapath::netlink::ifname_of(ifindex),
                host_ifindex: ifindex,
            },
        );
    }
    Ok(table)
}

/// An event as printed; `offset_ns`: wall clock minus monotonic clock.
pub fn describe(network: &str, event: &PolicyEvent, pod: Option<PodName>, offset_ns: u64) -> Drop {
    let src = address(event.family, event.src);
    let dst = address(event.family, event.dst);
    let ingress = u32::from(event.direction) == POLICY_DIR_INGRESS;
    Drop {
        time: rfc3339(event.timestamp_ns.saturating_add(offset_ns)),
        timestamp_ns: event.timestamp_ns,
        network: network.to_string(),
        slot: event.slot,
        pod,
        direction: if ingress { "ingress" } else { "egress" },
        peer: if ingress { src } else { dst },
        protocol: protocol_name(event.protocol),
        protocol_number: event.protocol,
        src,
        dst,
        src_port: u16::from_be_bytes(event.sport),
        dst_port: u16::from_be_bytes(event.dport),
        reason: reason_name(event.reason),
        bytes: event.len,
    }
}

/// The human form of a drop, one line.
pub fn render(drop: &Drop) -> String {
    let pod = match &drop.pod {
        Some(pod) => {
            let addresses: Vec<String> = pod.addresses.iter().map(ToString::to_string).collect();
            format!(
                "{} ({})",
                if addresses.is_empty() {
                    "?".to_string()
                } else {
                    addresses.join(",")
                },
                pod.host_veth.as_deref().unwrap_or("gone")
            )
        }
        None => format!("slot {} (no pod)", drop.slot),
    };
    let port = if drop.dst_port != 0 || matches!(drop.protocol_number, 6 | 17 | 132) {
        format!("{}/{}", drop.protocol, drop.dst_port)
    } else {
        drop.protocol.clone()
    };
    let endpoint = |ip: IpAddr, port: u16| match (ip, port) {
        (_, 0) => ip.to_string(),
        (IpAddr::V4(_), _) => format!("{ip}:{port}"),
        (IpAddr::V6(_), _) => format!("[{ip}]:{port}"),
    };
    format!(
        "{} {} {:<7} peer {} {} denied: {}  ({} -> {}, {} B)",
        drop.time,
        pod,
        drop.direction,
        drop.peer,
        port,
        drop.reason,
        endpoint(drop.src, drop.src_port),
        endpoint(drop.dst, drop.dst_port),
        drop.bytes
    )
}

/// Streams `network`'s policy drops to stdout until SIGINT or SIGTERM.
pub async fn run(network: &str, json: bool) -> Result<()> {
    let datapath = Datapath::new(network);
    if !datapath.exists() || datapath.pinned_mode().is_none() {
        return Err(Error::datapath(format!(
            "network {network} has no datapath (nothing pinned at {})",
            datapath.pin_dir().display()
        )));
    }
    let mut events = datapath.policy_events()?;
    let lost_before = lost_events(&datapath);
    eprintln!(
        "flatnet: monitoring NetworkPolicy drops of network {network} ({}); Ctrl-C to stop",
        datapath.pin_dir().display()
    );
    let mut pods = pod_table(&datapath)?;
    let mut read_at = std::time::Instant::now();
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| Error::io("installing the SIGINT handler", e))?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::io("installing the SIGTERM handler", e))?;
    let mut stdout = std::io::stdout().lock();
    loop {
        let batch = events.drain();
        let wait = if batch.is_empty() {
            POLL
        } else {
            Duration::ZERO
        };
        let offset = clock_ns(libc::CLOCK_REALTIME).saturating_sub(clock_ns(libc::CLOCK_MONOTONIC));
        for event in batch {
            if read_at.elapsed() > POD_TABLE_AGE || !pods.contains_key(&event.slot) {
                if let Ok(table) = pod_table(&datapath) {
                    pods = table;
                }
                read_at = std::time::Instant::now();
            }
            let drop = describe(network, &event, pods.get(&event.slot).cloned(), offset);
            let line = if json {
                serde_json::to_string(&drop)
                    .map_err(|e| Error::datapath(format!("encoding an event: {e}")))?
            } else {
                render(&drop)
            };
            if writeln!(stdout, "{line}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                // The reader went away (a closed pipe): done.
                return Ok(());
            }
        }
        // Signals are looked at between batches, also under a flood.
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            () = tokio::time::sleep(wait) => {}
        }
    }
    if let (Some(before), Some(after)) = (lost_before, lost_events(&datapath))
        && after > before
    {
        eprintln!(
            "flatnet: {} event(s) lost while monitoring (the ring buffer was full)",
            after - before
        );
    }
    Ok(())
}

/// Events the datapath could not write (`STATS` `policy_events_lost`).
fn lost_events(datapath: &Datapath) -> Option<u64> {
    datapath
        .stats()
        .ok()
        .map(|stats| stats[action::POLICY_EVENTS_LOST as usize].packets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        // 2024-02-29T12:34:56.789012Z
        assert_eq!(
            rfc3339(1_709_210_096_789_012_345),
            "2024-02-29T12:34:56.789012Z"
        );
    }

    #[test]
    fn events_read_as_drops() {
        let mut event = PolicyEvent {
            timestamp_ns: 5,
            family: 4,
            protocol: 6,
            direction: flatnet_common::POLICY_DIR_EGRESS as u8,
            reason: POLICY_REASON_PORT,
            slot: 9,
            len: 74,
            sport: 40000u16.to_be_bytes(),
            dport: 9090u16.to_be_bytes(),
            ..PolicyEvent::default()
        };
        event.src[..4].copy_from_slice(&[10, 0, 0, 1]);
        event.dst[..4].copy_from_slice(&[10, 0, 0, 2]);
        let pod = PodName {
            addresses: vec!["10.0.0.1".parse().unwrap()],
            host_veth: Some("flabc".into()),
            host_ifindex: 4,
        };
        let drop = describe("net", &event, Some(pod), 0);
        assert_eq!(drop.peer, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(
            (drop.direction, drop.reason),
            ("egress", "port-not-allowed")
        );
        assert_eq!(
            render(&drop),
            "1970-01-01T00:00:00.000000Z 10.0.0.1 (flabc) egress  peer 10.0.0.2 tcp/9090 denied: port-not-allowed  (10.0.0.1:40000 -> 10.0.0.2:9090, 74 B)"
        );
        event.direction = POLICY_DIR_INGRESS as u8;
        event.reason = POLICY_REASON_NO_PREFIX;
        let drop = describe("net", &event, None, 0);
        assert_eq!(drop.peer, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(drop.reason, "no-matching-prefix");
    }
}
