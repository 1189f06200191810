//! Which specs run: the suites (ginkgo focus), what every run skips and
//! why, and the skip expression a suite runs with.

use super::super::cluster::ServicesMode;

/// A set of specs chosen by ginkgo's focus and skip expressions.
pub struct Suite {
    pub name: &'static str,
    pub focus: &'static str,
    /// Specs of the focus this cluster cannot run, and why (docs/kubernetes.md).
    pub skips: &'static [(&'static str, &'static str)],
    /// Run in CI (`cargo xtask test`) as well as with `--full`.
    pub in_ci: bool,
    /// Services modes it runs in.
    pub modes: &'static [ServicesMode],
    /// ginkgo's parallel processes (`-nodes`): the specs mostly wait, so
    /// the CI subset runs three at once on two cores, which ends it when
    /// its longest spec (an egress policy, ~2 min) does.
    pub parallel: u8,
    /// Runs `[Serial]` and `[Disruptive]` specs: alone on the cluster
    /// (one process, after the suites before it).
    pub serial: bool,
    /// Runs on dual-stack clusters only.
    pub dual_stack_only: bool,
}

/// The `[Serial]` and `[Disruptive]` skips of `COMMON_SKIPS`, left out
/// where a suite runs alone.
const SERIAL: &str = r"\[Serial\]";
const DISRUPTIVE: &str = r"\[Disruptive\]";

const EVERY_MODE: &[ServicesMode] = &ServicesMode::ALL;

/// Skips shared by every suite: what no cluster on this machine can do.
pub const COMMON_SKIPS: &[(&str, &str)] = &[
    (
        SERIAL,
        "needs the whole cluster to itself: the sig-network-serial suite runs them, one at a time, after the others",
    ),
    (
        DISRUPTIVE,
        "restarts or breaks nodes and components: the sig-network-serial suite runs them, one at a time, after the others",
    ),
    (r"\[Flaky\]", "marked flaky upstream"),
    (
        r"\[Feature:SCTP\]|\[Feature:SCTPConnectivity\]",
        "SCTP: not built into this kernel",
    ),
    (
        r"\[Feature:Networking-IPv4\]|\[Feature:Networking-IPv6\]|\[Feature:Networking-DNS\]",
        "dials 8.8.8.8, 2001:4860:4860::8888 or google.com: no traffic may leave this machine",
    ),
    (
        r"\[Feature:(Ingress|NEG|kubemci|IngressScale)\]",
        "needs a cloud's L7 load balancer or an ingress controller",
    ),
    (
        r"\[Feature:LoadBalancer\]",
        "needs a load-balancer controller (a cloud's, or MetalLB's) to give the Service an ingress address: none runs here, and each spec would wait 15 min for one (flatnet's handling of ingress addresses and ipMode is tested without one: services::tests, nodeport/)",
    ),
    (
        r"DNS configMap nameserver",
        "reconfigure CoreDNS through its ConfigMap (a stub domain, forwarding to an upstream server): the cluster DNS here is flatnet-cluster-dns, which has no such ConfigMap and never forwards",
    ),
    (
        r"\[Feature:Networking-Performance\]",
        "parses the CSV of iperf 2.2 (17 fields a line); the agnhost image here carries Debian 12's iperf 2.1.8 (9 fields), and iperf 2.2 is not packaged for it (pod-to-Service throughput was measured, 3.4 Gbit/s, then the parse failed; `cargo xtask bench` measures throughput against the kernel bridge)",
    ),
    (
        r"\[Feature:PerformanceDNS\]",
        "a scale test (10,000 Services in one cluster), not a networking check: cluster scale is measured on its own",
    ),
    (
        r"\[Feature:Example\]",
        "runs the example applications' images (python, redis), which are not built here",
    ),
    (
        r"\[Feature:OffByDefault\]",
        "needs a feature gate its release leaves off, and the clusters here run every component's defaults: on 1.35, RelaxedServiceNameValidation (alpha), whose spec the API server answers by refusing a Service named 1kubernetes (it ran and failed so); an API rule, not networking",
    ),
];

/// Skipped on an IPv4-only cluster (`--dual-stack` runs them).
pub const IPV4_ONLY_SKIPS: &[(&str, &str)] = &[(
    r"\[Feature:IPv6DualStack\]",
    "need a dual-stack cluster: run with --dual-stack",
)];

/// Specs that need kube-proxy itself, skipped with `--services ebpf`.
/// The NodePort-dialing specs run: they dial from pods and host-network
/// pods, which flatnet's socket programs serve (18 of 18 passed with
/// kube-proxy absent, `--focus` at f761931).
const NEEDS_KUBE_PROXY: &[(&str, &str)] = &[
    (
        r"kube-proxy urls|KubeProxy should set TCP CLOSE_WAIT timeout|\[Feature:KubeProxyNFAcct\]",
        "asks kube-proxy itself (its healthz and metrics ports, its nfacct counters, the conntrack timeouts it sets)",
    ),
    LOCALHOST_NODE_PORTS,
    (
        r"should allow creating a Pod with an SCTP HostPort",
        "flatnet's BPF hostPorts (kube-proxy absent, portmap not chained) serve TCP and UDP: an SCTP hostPort is refused at ADD, saying to chain portmap (and this kernel has no SCTP)",
    ),
];

/// NodePorts on 127.0.0.1: kube-proxy's iptables mode serves them
/// (`route_localnet`), its nftables mode does not, nor do flatnet's socket
/// programs (see docs/services-and-policy.md).
const LOCALHOST_NODE_PORTS: (&str, &str) = (
    r"\[Feature:LocalhostNodePorts\]",
    "NodePorts on localhost: kube-proxy's iptables mode only (its nftables mode and flatnet's eBPF Services do not serve 127.0.0.1)",
);

pub const SUITES: &[Suite] = &[
    // The CI subset: pod to pod on and across nodes, ClusterIP Services
    // through each mode, cluster DNS, and NetworkPolicy in both directions
    // including a client created after its egress policy.
    Suite {
        name: "ci",
        focus: concat!(
            r"\[sig-network\] Networking Granular Checks: Pods should function for intra-pod communication: (http|udp)",
            r"|\[sig-network\] Networking Granular Checks: Services should be able to handle large requests: udp",
            r"|\[sig-network\] Networking Granular Checks: Services should function for client IP based session affinity: http",
            r"|\[sig-network\] Services should serve multiport endpoints from pods",
            r"|\[sig-network\] DNS should provide DNS for services",
            r"|NetworkPolicy between server and client should support a 'default-deny-ingress' policy",
            r"|NetworkPolicy between server and client should enforce egress policy allowing traffic to a server in a different namespace",
        ),
        skips: &[],
        in_ci: true,
        modes: EVERY_MODE,
        parallel: 3,
        serial: false,
        dual_stack_only: false,
    },
    // hostPort by hostIP and protocol, from a host-network pod (curl, nc):
    // portmap's rules with kube-proxy, flatnet's BPF hostPorts without.
    // A scheduling spec, [Serial] for the node labels it sets.
    Suite {
        name: "host-ports",
        focus: r"validates that there is no conflict between pods with same hostPort but different hostIP and protocol",
        skips: &[],
        in_ci: true,
        modes: EVERY_MODE,
        parallel: 1,
        serial: true,
        dual_stack_only: false,
    },
    // Both families on a dual-stack cluster: a pod's two addresses, a
    // Service of both families, and pod to Service over each family.
    Suite {
        name: "dual-stack",
        focus: concat!(
            r"\[Feature:IPv6DualStack\] .*(should be able to reach pod on ipv4 and ipv6 ip",
            r"|should create service with ipv4,v6 cluster ip",
            r"|should function for pod-Service: (http|udp))",
        ),
        skips: &[],
        in_ci: true,
        modes: EVERY_MODE,
        parallel: 3,
        serial: false,
        dual_stack_only: true,
    },
    Suite {
        name: "sig-network",
        focus: r"\[sig-network\]",
        skips: &[],
        in_ci: false,
        modes: &[ServicesMode::KubeProxy],
        parallel: 2,
        serial: false,
        dual_stack_only: false,
    },
    Suite {
        name: "sig-network",
        focus: r"\[sig-network\]",
        skips: &[LOCALHOST_NODE_PORTS],
        in_ci: false,
        modes: &[ServicesMode::KubeProxyNftables],
        parallel: 2,
        serial: false,
        dual_stack_only: false,
    },
    Suite {
        name: "sig-network",
        focus: r"\[sig-network\]",
        skips: NEEDS_KUBE_PROXY,
        in_ci: false,
        modes: &[ServicesMode::Ebpf],
        parallel: 2,
        serial: false,
        dual_stack_only: false,
    },
    // Each mode skips here what its sig-network suite skips (the SCTP
    // hostPort spec without kube-proxy is [Serial]: only this suite runs it).
    serial_suite(&[ServicesMode::KubeProxy], &[]),
    serial_suite(&[ServicesMode::KubeProxyNftables], &[LOCALHOST_NODE_PORTS]),
    serial_suite(&[ServicesMode::Ebpf], NEEDS_KUBE_PROXY),
];

/// What the suites above leave out in `modes`: [Serial] and [Disruptive]
/// specs, one at a time on the whole cluster (those that restart a
/// component kubelet runs as a pod, or reach nodes over SSH, skip
/// themselves), with the modes' own `skips`.
const fn serial_suite(
    modes: &'static [ServicesMode],
    skips: &'static [(&'static str, &'static str)],
) -> Suite {
    Suite {
        name: "sig-network-serial",
        focus: r"\[sig-network\].*(\[Serial\]|\[Disruptive\])",
        skips,
        in_ci: false,
        modes,
        parallel: 1,
        serial: true,
        dual_stack_only: false,
    }
}

pub fn skip_expression(skips: &[(&str, &str)], serial: bool, dual_stack: bool) -> String {
    let family_skips = if dual_stack { &[][..] } else { IPV4_ONLY_SKIPS };
    COMMON_SKIPS
        .iter()
        .chain(family_skips)
        .chain(skips)
        .map(|(pattern, _)| *pattern)
        .filter(|pattern| !(serial && (*pattern == SERIAL || *pattern == DISRUPTIVE)))
        .collect::<Vec<_>>()
        .join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serial_suite_runs_serial_specs_and_skips_the_rest_as_others_do() {
        let parallel = skip_expression(&[], false, false);
        let serial = skip_expression(&[], true, false);
        assert!(parallel.contains(SERIAL), "{parallel}");
        assert!(!serial.contains(SERIAL), "{serial}");
        assert_eq!(
            parallel.split('|').count(),
            serial.split('|').count() + 2,
            "only [Serial] and [Disruptive] differ"
        );
        let host_ports = SUITES.iter().find(|s| s.name == "host-ports").unwrap();
        assert!(host_ports.serial && host_ports.in_ci && host_ports.parallel == 1);
    }

    /// A mode's skip must reach its [Serial] specs too: the eBPF mode's
    /// SCTP hostPort skip once sat only on the parallel suite, which never
    /// runs that [Serial] spec, and the full run failed on it.
    #[test]
    fn each_mode_skips_in_its_serial_suite_what_it_skips_in_sig_network() {
        for mode in EVERY_MODE {
            let of = |name: &str| {
                let suites: Vec<&Suite> = SUITES
                    .iter()
                    .filter(|s| s.name == name && s.modes.contains(mode))
                    .collect();
                assert_eq!(suites.len(), 1, "{name} for {mode:?}");
                suites[0]
            };
            let (parallel, serial) = (of("sig-network"), of("sig-network-serial"));
            for skip in parallel.skips {
                assert!(
                    serial.skips.contains(skip),
                    "{mode:?}: sig-network-serial does not skip {}",
                    skip.0
                );
            }
        }
    }
}
