//! The datapath's counters, read from the pinned maps at each scrape.

use flatnet_common::{EndpointCounters, action};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use flatnet_datapath::bpf::Datapath;

/// Picks one field of a pod's counters.
type ReadCounter = fn(&EndpointCounters) -> u64;

/// Reads the datapath's maps at scrape time: nothing is cached, so a
/// scrape always shows what the kernel counted.
#[derive(Debug)]
pub(super) struct DatapathCollector {
    pub(super) datapath: Datapath,
}

impl Collector for DatapathCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let datapath = &self.datapath;
        // Before the first load there is nothing to report (not an error).
        let Ok(stats) = datapath.stats() else {
            return Ok(());
        };
        for (name, help, pick) in [
            (
                "flatnet_datapath_packets",
                "Packets the eBPF datapath handled, by what it did with them",
                0,
            ),
            (
                "flatnet_datapath_bytes",
                "Bytes the eBPF datapath handled, by what it did with them",
                1,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (index, action_name) in action::NAMES.iter().enumerate() {
                let value = if pick == 0 {
                    stats[index].packets
                } else {
                    stats[index].bytes
                };
                ConstCounter::new(value)
                    .encode(family.encode_family(&[("action", *action_name)])?)?;
            }
        }
        if let Ok(veths) = datapath.host_veths() {
            let pods: Vec<(u32, EndpointCounters)> = veths
                .iter()
                .filter_map(|(index, pod)| {
                    Some((*index, datapath.slot_counters(pod.counter_slot).ok()?))
                })
                .collect();
            let fields: [(&str, &str, ReadCounter); 4] = [
                ("flatnet_pod_tx_packets", "Packets a pod sent", |c| {
                    c.tx_packets
                }),
                ("flatnet_pod_tx_bytes", "Bytes a pod sent", |c| c.tx_bytes),
                (
                    "flatnet_pod_rx_packets",
                    "Packets the datapath delivered to a pod",
                    |c| c.rx_packets,
                ),
                (
                    "flatnet_pod_rx_bytes",
                    "Bytes the datapath delivered to a pod",
                    |c| c.rx_bytes,
                ),
            ];
            for (name, help, read) in fields {
                let mut family =
                    encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                for (index, counters) in &pods {
                    ConstCounter::new(read(counters)).encode(
                        family.encode_family(&[("host_veth_ifindex", index.to_string())])?,
                    )?;
                }
            }
            // NetworkPolicy drops per pod and direction (a datapath
            // pinned without `POLICY_DROPS` has none to report).
            let drops: Vec<(u32, (u64, u64))> = veths
                .iter()
                .filter_map(|(index, pod)| {
                    Some((*index, datapath.policy_drops(pod.counter_slot).ok()?))
                })
                .collect();
            if !drops.is_empty() {
                let mut family = encoder.encode_descriptor(
                    "flatnet_policy_denied_packets",
                    "Packets NetworkPolicy dropped, per pod and direction",
                    None,
                    MetricType::Counter,
                )?;
                for (index, (ingress, egress)) in &drops {
                    for (direction, value) in [("ingress", *ingress), ("egress", *egress)] {
                        ConstCounter::new(value).encode(family.encode_family(&[
                            ("host_veth_ifindex", index.to_string()),
                            ("direction", direction.to_string()),
                        ])?)?;
                    }
                }
            }
        }
        if let Ok(remote) = datapath.remote_cidrs() {
            let gauge = ConstGauge::new(remote.len() as i64);
            gauge.encode(encoder.encode_descriptor(
                "flatnet_remote_cidrs",
                "Other nodes' pod CIDRs the fast path knows",
                None,
                gauge.metric_type(),
            )?)?;
        }
        Ok(())
    }
}
