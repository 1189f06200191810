//! `flatnet-agent`'s flags. Each one can also come from the environment
//! (the DaemonSet's ConfigMap sets them that way).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use flatnet_common::PIN_ROOT;
use ipnetwork::IpNetwork;

use flatnet_datapath::DatapathMode;

/// Where the agent learns the cluster's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    /// Node objects from the Kubernetes API (KUBECONFIG or ~/.kube/config,
    /// else in-cluster).
    Kubernetes,
    /// A YAML/JSON file listing the nodes (`--peer-file`), polled.
    File,
}

/// Who serves a Pod's `hostPort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostPortsMode {
    Auto,
    Portmap,
    Ebpf,
}

/// Who load-balances ClusterIP traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServicesMode {
    /// kube-proxy's rules; flatnet hands translated flows to the stack.
    KubeProxy,
    /// flatnet's socket programs at the cgroup (`--services-cgroup`):
    /// connect() and sendmsg() to a ClusterIP go to a backend directly.
    Ebpf,
}

/// The datapath mode written into the conflist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Tc,
    Xdp,
}

impl Args {
    /// Whether flatnet serves hostPorts in BPF (`--host-ports`); an error
    /// for `ebpf` where it cannot.
    pub fn host_ports_in_bpf(&self) -> Result<bool, String> {
        let possible = self.services == ServicesMode::Ebpf;
        match self.host_ports {
            HostPortsMode::Auto => Ok(possible),
            HostPortsMode::Portmap => Ok(false),
            HostPortsMode::Ebpf if possible => Ok(true),
            HostPortsMode::Ebpf => Err(
                "--host-ports ebpf needs --services ebpf (the socket programs serve hostPorts to pods and the node); use --host-ports portmap otherwise".into(),
            ),
        }
    }

    /// Whether the conflist chains portmap.
    pub fn chains_portmap(&self) -> bool {
        self.chain_portmap && !self.host_ports_in_bpf().unwrap_or(false)
    }
}

impl From<Mode> for DatapathMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Tc => DatapathMode::Tc,
            Mode::Xdp => DatapathMode::Xdp,
        }
    }
}

/// flatnet's node agent: sets this node up for pods (datapath, uplink
/// program, routes to the other nodes' pod CIDRs, conflist, binaries) and
/// keeps it so as nodes come and go.
#[derive(Debug, Clone, Parser)]
#[command(name = "flatnet-agent", version)]
pub struct Args {
    /// This node's name, as the peer source lists it.
    #[arg(long, env = "NODE_NAME", required_unless_present = "uninstall")]
    pub node_name: Option<String>,

    /// Remove what the agent put on this node (conflist, markers, peer
    /// routes, uplink filter, remote-CIDR entries, no-masquerade sets) and
    /// exit. Running pods keep working locally. Run it after the DaemonSet
    /// is gone, with the same network, directories and pin root.
    #[arg(long)]
    pub uninstall: bool,

    /// The CNI network name (conflist `name`; pins under <pin-root>/<network>).
    #[arg(long, env = "FLATNET_NETWORK", default_value = "flatnet")]
    pub network: String,

    #[arg(
        long,
        env = "FLATNET_PEER_SOURCE",
        value_enum,
        default_value = "kubernetes"
    )]
    pub peer_source: SourceKind,

    /// With `--peer-source kubernetes`: an API server URL that needs no
    /// credentials (`kubectl proxy`); default: KUBECONFIG or ~/.kube/config
    /// if there is one, else the in-cluster service account.
    #[arg(long, env = "FLATNET_KUBE_API_SERVER")]
    pub kube_api_server: Option<String>,

    /// The peer file (with `--peer-source file`).
    #[arg(long, env = "FLATNET_PEER_FILE")]
    pub peer_file: Option<PathBuf>,

    /// How often the peer file is re-read, in milliseconds.
    #[arg(long, env = "FLATNET_PEER_FILE_POLL_MS", default_value_t = 1000)]
    pub peer_file_poll_ms: u64,

    /// The interface other nodes are reached through; default: the one
    /// holding this node's address.
    #[arg(long, env = "FLATNET_UPLINK")]
    pub uplink: Option<String>,

    #[arg(long, env = "FLATNET_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,

    #[arg(
        long,
        env = "FLATNET_CONFLIST_NAME",
        default_value = "10-flatnet.conflist"
    )]
    pub conflist_name: String,

    #[arg(long, env = "FLATNET_CNI_BIN_DIR", default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,

    /// Where the binaries to install are; default: this program's directory.
    #[arg(long, env = "FLATNET_INSTALL_FROM")]
    pub install_from: Option<PathBuf>,

    /// Copy flatnet and flatnet-ipam into the CNI bin dir.
    #[arg(long, env = "FLATNET_INSTALL_BINARIES", default_value_t = true, action = clap::ArgAction::Set)]
    pub install_binaries: bool,

    /// The pods' gateway device (conflist `bridge`).
    #[arg(long, env = "FLATNET_BRIDGE", default_value = "flatnet0")]
    pub bridge: String,

    /// Pod MTU; default: the uplink's with `--routing direct`, less VXLAN's
    /// 50 bytes (70 over an IPv6 underlay) otherwise.
    #[arg(long, env = "FLATNET_MTU")]
    pub mtu: Option<u32>,

    /// How pod packets cross to other nodes: `direct` (host-gw: routes via
    /// the peer's address, every node on one L2 segment), `vxlan` (all in
    /// VXLAN between node addresses), `auto` (direct to peers on one of
    /// this node's connected subnets, VXLAN to the rest).
    #[arg(long, env = "FLATNET_ROUTING", value_enum, default_value = "auto")]
    pub routing: crate::peers::RoutingMode,

    /// The VXLAN device's UDP port (open it between nodes).
    #[arg(long, env = "FLATNET_VXLAN_PORT", default_value_t = 8472)]
    pub vxlan_port: u16,

    /// The VXLAN network identifier of pod traffic.
    #[arg(long, env = "FLATNET_VXLAN_VNI", default_value_t = 1)]
    pub vxlan_vni: u32,

    #[arg(long, env = "FLATNET_DATAPATH", value_enum, default_value = "tc")]
    pub datapath: Mode,

    /// Masquerade pod traffic leaving the node's pod CIDR (conflist `ipMasq`).
    #[arg(long, env = "FLATNET_IP_MASQ", default_value_t = false, action = clap::ArgAction::Set)]
    pub ip_masq: bool,

    /// flatnet-ipam's `dataDir`; default: flatnet-ipam's own.
    #[arg(long, env = "FLATNET_IPAM_DATA_DIR")]
    pub ipam_data_dir: Option<PathBuf>,

    /// bpffs directory the networks are pinned under; the conflist the
    /// agent writes carries it (`pinRoot`) to the plugin.
    #[arg(long, env = "FLATNET_PIN_ROOT", default_value = PIN_ROOT)]
    pub pin_root: PathBuf,

    /// A map sized per node given its own number of entries, `NAME=ENTRIES`
    /// (e.g. `POLICY_PEERS=131072`; repeat the flag, or comma-separate in
    /// the variable); the conflist carries it (`mapSizes`) to the plugin.
    #[arg(
        long = "map-size",
        env = "FLATNET_MAP_SIZES",
        value_delimiter = ',',
        value_name = "NAME=ENTRIES"
    )]
    pub map_sizes: Vec<String>,

    /// The fraction of the node's memory the preallocated flow tables
    /// (FLOWS, NAT_FORWARD, NAT_REVERSE, POLICY_FLOWS) take together; 0:
    /// their built-in sizes (`mapMemoryRatio` in the conflist).
    #[arg(long, env = "FLATNET_MAP_MEMORY_RATIO", default_value_t = flatnet_datapath::bpf::sizes::DEFAULT_MEMORY_RATIO)]
    pub map_memory_ratio: f64,

    /// Where Prometheus metrics (/metrics) and readiness (/readyz) are served.
    #[arg(long, env = "FLATNET_METRICS_ADDR", default_value = "127.0.0.1:9603")]
    pub metrics_addr: SocketAddr,

    /// Seconds between full re-checks of routes, maps, attachments and
    /// (with `--cri-socket`) address reclaim; fractions are allowed.
    #[arg(long, env = "FLATNET_RESYNC_SECS", default_value_t = 30.0)]
    pub resync_secs: f64,

    /// Chain the reference portmap plugin after flatnet (`portMappings`
    /// capability, snat on) for a Pod's `hostPort`, when hostPorts are
    /// portmap's (`--host-ports`).
    #[arg(long, env = "FLATNET_CHAIN_PORTMAP", default_value_t = true, action = clap::ArgAction::Set)]
    pub chain_portmap: bool,

    /// Who serves a Pod's `hostPort`: `portmap` (its iptables rules),
    /// `ebpf` (flatnet declares the `portMappings` capability itself and
    /// serves each hostPort as a frontend of its Service maps: needs
    /// `--services ebpf`), or `auto`: `ebpf` with `--services ebpf`, else
    /// `portmap`.
    #[arg(long, env = "FLATNET_HOST_PORTS", value_enum, default_value = "auto")]
    pub host_ports: HostPortsMode,

    /// Chain the reference bandwidth plugin after flatnet (`bandwidth`
    /// capability): the `kubernetes.io/ingress-bandwidth` and
    /// `egress-bandwidth` annotations shape a pod's traffic.
    #[arg(long, env = "FLATNET_CHAIN_BANDWIDTH", default_value_t = true, action = clap::ArgAction::Set)]
    pub chain_bandwidth: bool,

    /// Where the chained reference plugins are found when the CNI bin dir
    /// lacks them (the image ships them here); one there already is kept
    /// unless it is an older release.
    #[arg(
        long,
        env = "FLATNET_REFERENCE_PLUGINS_FROM",
        default_value = "/usr/lib/cni"
    )]
    pub reference_plugins_from: PathBuf,

    /// The container runtime's CRI socket (containerd:
    /// /run/containerd/containerd.sock). With it, every resync releases
    /// addresses and datapath entries of attachments no sandbox of the
    /// runtime owns any more (a DEL that never came), after the grace period.
    #[arg(long, env = "FLATNET_CRI_SOCKET")]
    pub cri_socket: Option<PathBuf>,

    /// Seconds an attachment must stay without a sandbox before it is
    /// reclaimed: longer than any ADD takes from address to listed sandbox.
    #[arg(long, env = "FLATNET_RECLAIM_GRACE_SECS", default_value_t = 60.0)]
    pub reclaim_grace_secs: f64,

    /// libcni's cache (`<dir>/results/<network>-<id>-<ifname>`): a reclaim
    /// DEL passes the cached result as prevResult and removes the entry,
    /// as the runtime's own DEL would.
    #[arg(long, env = "FLATNET_CNI_CACHE_DIR", default_value = "/var/lib/cni")]
    pub cni_cache_dir: PathBuf,

    /// With `--peer-source kubernetes`: watch NetworkPolicies, Pods and
    /// Namespaces and enforce the policies of this node's pods in the
    /// datapath (needs get/list/watch on them).
    #[arg(long, env = "FLATNET_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    pub network_policy: bool,

    /// Who load-balances Service traffic: `kube-proxy` (its rules), or
    /// `ebpf` (with `--peer-source kubernetes`: this agent watches Services
    /// and EndpointSlices; flatnet's socket programs choose a backend at
    /// connect() and sendmsg() for ClusterIPs, externalIPs, load-balancer
    /// IPs and NodePorts for this node's pods and the node itself, and in
    /// tc mode the uplink program serves NodePorts and external addresses
    /// to clients outside the node, translating them in BPF).
    #[arg(
        long,
        env = "FLATNET_SERVICES",
        value_enum,
        default_value = "kube-proxy"
    )]
    pub services: ServicesMode,

    /// The cgroup v2 directory the socket programs are attached to
    /// (default: the root of the cgroup v2 mount: every process of the node).
    #[arg(long, env = "FLATNET_SERVICES_CGROUP")]
    pub services_cgroup: Option<PathBuf>,

    /// With `--services ebpf`: the node addresses NodePorts are served on,
    /// as CIDRs (kube-proxy's `--nodeport-addresses`), comma-separated;
    /// default every InternalIP of every node.
    #[arg(long, env = "FLATNET_NODEPORT_ADDRESSES", value_delimiter = ',')]
    pub nodeport_addresses: Vec<IpNetwork>,

    /// Log filter (tracing's EnvFilter syntax), e.g. `info` or `flatnet=debug`.
    #[arg(long, env = "FLATNET_LOG", default_value = "info")]
    pub log: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_match_a_kubernetes_node() {
        let args = Args::try_parse_from(["flatnet-agent", "--node-name", "n1"]).unwrap();
        assert_eq!(args.peer_source, SourceKind::Kubernetes);
        assert_eq!(args.cni_conf_dir, PathBuf::from("/etc/cni/net.d"));
        assert_eq!(args.cni_bin_dir, PathBuf::from("/opt/cni/bin"));
        assert_eq!(args.pin_root, PathBuf::from("/sys/fs/bpf/flatnet"));
        assert!(args.install_binaries);
        assert!(!args.ip_masq);
        assert!(args.chain_portmap && args.chain_bandwidth);
        assert_eq!(args.cri_socket, None);
        assert_eq!(args.reference_plugins_from, PathBuf::from("/usr/lib/cni"));
        assert!(args.network_policy);
        let args = Args::try_parse_from([
            "flatnet-agent",
            "--node-name=n1",
            "--peer-source=file",
            "--peer-file=/etc/flatnet/peers.yaml",
            "--install-binaries=false",
            "--datapath=xdp",
            "--network-policy=false",
        ])
        .unwrap();
        assert!(!args.network_policy);
        assert_eq!(args.peer_source, SourceKind::File);
        assert!(!args.install_binaries);
        assert_eq!(DatapathMode::from(args.datapath), DatapathMode::Xdp);
    }

    #[test]
    fn host_ports_go_to_bpf_where_the_socket_and_uplink_programs_serve_them() {
        let args = |extra: &[&str]| {
            let mut all = vec!["flatnet-agent", "--node-name=n1"];
            all.extend_from_slice(extra);
            Args::try_parse_from(all).unwrap()
        };
        let kube_proxy = args(&[]);
        assert_eq!(kube_proxy.host_ports, HostPortsMode::Auto);
        assert_eq!(kube_proxy.host_ports_in_bpf(), Ok(false));
        assert!(kube_proxy.chains_portmap());
        let ebpf = args(&["--services=ebpf"]);
        assert_eq!(ebpf.host_ports_in_bpf(), Ok(true));
        assert!(!ebpf.chains_portmap());
        let chosen = args(&["--services=ebpf", "--host-ports=portmap"]);
        assert_eq!(chosen.host_ports_in_bpf(), Ok(false));
        assert!(chosen.chains_portmap());
        // XDP mode too: the uplink program serves clients outside, and a
        // pod's replies are translated at tc behind its XDP program.
        assert_eq!(
            args(&["--services=ebpf", "--datapath=xdp"]).host_ports_in_bpf(),
            Ok(true)
        );
        let err = args(&["--host-ports=ebpf"])
            .host_ports_in_bpf()
            .unwrap_err();
        assert!(err.contains("--host-ports portmap"), "{err}");
    }

    #[test]
    fn uninstall_needs_no_node_name_and_running_does() {
        let args = Args::try_parse_from(["flatnet-agent", "--uninstall"]).unwrap();
        assert!(args.uninstall);
        assert_eq!(args.node_name, None);
        // (NODE_NAME from the environment would satisfy it: not in tests.)
        if std::env::var_os("NODE_NAME").is_none() {
            assert!(Args::try_parse_from(["flatnet-agent"]).is_err());
        }
    }

    #[test]
    fn the_kubeconfig_help_names_the_order_kube_infers_in() {
        // kube's Config::infer reads KUBECONFIG / ~/.kube/config first and
        // falls back to the in-cluster service account.
        let command = Args::command();
        let help = command
            .get_arguments()
            .find(|a| a.get_id() == "kube_api_server")
            .and_then(|a| a.get_help())
            .map(|h| h.to_string())
            .unwrap();
        let kubeconfig = help.find("KUBECONFIG").expect("mentions KUBECONFIG");
        let in_cluster = help.find("in-cluster").expect("mentions in-cluster");
        assert!(kubeconfig < in_cluster, "{help}");
    }
}
