//! NodePort (kube-proxy's rules) and hostPort (portmap's) reach pods on the
//! fast path's nodes.

use super::*;

/// A NodePort Service whose backend is on n1, reached from a pod on n1
/// (n1's address), and from a pod on n2 (n1's address, and n2's own,
/// which sends it on to n1); also with the nodes tunnelled (`--routing
/// vxlan`: n2's stack sends the translated packets into the tunnel).
#[flatnet_test(root, cases(iptables(Mode::Iptables, &[]), nftables(Mode::Nftables, &[]), vxlan_iptables(Mode::Iptables, &["--routing", "vxlan"]), vxlan_nftables(Mode::Nftables, &["--routing", "vxlan"])))]
fn nodeport(mode: Mode, flags: &[&str]) {
    let services = ServiceCluster::flagged(mode, 2, flags);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let backend = n1.pod();
    let (near, far) = (n1.pod(), n2.pod());
    let _tcp = TcpBackend::start(&backend, "b", BACKEND_PORT);
    let list: Vec<ServicePort> = web_in_both_families(&[&backend])
        .into_iter()
        .map(|service| service.with_node_port(NODE_PORT))
        .collect();
    services.program(&list);
    for family in FAMILIES {
        for (client, node, what) in [
            (&near, n1, "same node"),
            (&far, n1, "another node, to the backend's node"),
            (&far, n2, "another node, to its own node"),
        ] {
            let to = SocketAddr::new(node_ip(node, family), NODE_PORT);
            let name = tcp_request(client, to, 64 << 10)
                .unwrap_or_else(|e| panic!("{mode:?} {family:?} NodePort from {what} ({to}): {e}"));
            assert_eq!(name, "b");
        }
    }
}

const HOST_PORT: u16 = 8081;

/// The reference portmap plugin chained after flatnet for one pod (what a
/// Pod's hostPort asks for: a runtime chains it so); DEL on drop.
pub(crate) struct PortMapping<'a> {
    pod: &'a SimPod<'a>,
    conf: serde_json::Value,
}

impl<'a> PortMapping<'a> {
    /// `host_port` to `container_port` for each of `protocols`, on every
    /// address of both families.
    pub(crate) fn add(
        pod: &'a SimPod<'a>,
        host_port: u16,
        container_port: u16,
        protocols: &[&str],
    ) -> Self {
        let mappings: Vec<serde_json::Value> = protocols
            .iter()
            .flat_map(|protocol| {
                ["0.0.0.0", "::"].map(|host_ip| {
                    serde_json::json!({"hostPort": host_port, "containerPort": container_port,
                        "protocol": protocol, "hostIP": host_ip})
                })
            })
            .collect();
        // Debian's portmap (1.1.1) speaks CNI 1.0.0 at most: the list runs
        // at 1.0.0, and flatnet's 1.1.0 result reads the same there.
        let mut prev_result = pod.result.clone();
        prev_result["cniVersion"] = serde_json::json!("1.0.0");
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": pod.node.network,
            "type": "portmap",
            "snat": true,
            "capabilities": {"portMappings": true},
            "runtimeConfig": {"portMappings": mappings},
            "prevResult": prev_result,
        });
        let mapping = PortMapping { pod, conf };
        let out = mapping.run("ADD");
        assert!(out.success(), "portmap ADD: {out:?}");
        mapping
    }

    fn run(&self, command: &str) -> CniOutput {
        let mut call = CniCall::new(command, &self.pod.container, &self.pod.netns.path(), "eth0");
        call.node = Some(self.pod.node.netns.path());
        call.run(
            &find_plugin("portmap", &call.path),
            self.conf.to_string().as_bytes(),
        )
    }
}

impl Drop for PortMapping<'_> {
    fn drop(&mut self) {
        let out = self.run("DEL");
        if !out.success() {
            eprintln!("portmap DEL failed: {out:?}");
        }
    }
}

/// A hostPort (portmap chained, snat on) on n1, reached from a pod on n1
/// and from a pod on n2, next to kube-proxy's rules.
#[flatnet_test(root, cases(iptables(Mode::Iptables), nftables(Mode::Nftables)))]
fn hostport(mode: Mode) {
    let services = ServiceCluster::new(mode, 2);
    let (n1, n2) = (services.node("n1"), services.node("n2"));
    let backend = n1.pod();
    let (near, far) = (n1.pod(), n2.pod());
    let _tcp = TcpBackend::start(&backend, "b", BACKEND_PORT);
    let _mapping = PortMapping::add(&backend, HOST_PORT, BACKEND_PORT, &["tcp"]);
    let list = web_in_both_families(&[&backend]);
    services.program(&list);
    for family in FAMILIES {
        let before = n1.packets(action::TRANSLATED);
        for (client, what) in [(&near, "same node"), (&far, "another node")] {
            let to = SocketAddr::new(node_ip(n1, family), HOST_PORT);
            let name = tcp_request(client, to, 64 << 10)
                .unwrap_or_else(|e| panic!("{mode:?} {family:?} hostPort from {what} ({to}): {e}"));
            assert_eq!(name, "b");
        }
        // Both replies met a DNAT the fast path had to leave to the stack
        // (one for a local pod, one for a pod on another node).
        assert!(n1.packets(action::TRANSLATED) > before);
    }
}
