//! kube-proxy's Service rules, written as kube-proxy writes them, for a
//! simulated node: the fixture stands for kube-proxy in its iptables mode
//! (`iptables-restore --noflush` of the KUBE-SERVICES / KUBE-SVC-* /
//! KUBE-SEP-* / KUBE-MARK-MASQ / KUBE-POSTROUTING chains, KUBE-FORWARD in
//! the filter table) and in its nftables mode (the `kube-proxy` tables of
//! families ip and ip6, with the `service-ips` and `service-nodeports`
//! verdict maps, `numgen random` over endpoint chains and the
//! `mark-for-masquerade` / `masquerading` pair). The shapes follow
//! kube-proxy's own expected-rules tests (pkg/proxy/iptables and
//! pkg/proxy/nftables, `TestOverall*Rules`) for a cluster whose
//! `--cluster-cidr` is set, as kubeadm sets it: pods are not masqueraded to
//! a ClusterIP, everything from outside the cluster CIDR is; a pod reaching
//! itself (hairpin) is; NodePort traffic (externalTrafficPolicy Cluster)
//! always is. IPVS mode cannot be reproduced: this kernel has no IPVS.
//!
//! Rules are applied inside a node's network namespace with the real
//! `iptables-restore`/`ip6tables-restore` (iptables-nft) and `nft`, so they
//! go with the namespace. The integration tests (`flatnet_tests::kube_proxy`)
//! and the benchmark's ClusterIP row both use it.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};

use sha2::Digest;

/// How kube-proxy programs the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }

    fn upper(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

/// One port of a Service, as kube-proxy sees it after reading the Service
/// and its EndpointSlices (ready endpoints only).
#[derive(Clone, Debug)]
pub struct ServicePort {
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    /// Type NodePort.
    pub node_port: Option<u16>,
    pub endpoints: Vec<SocketAddr>,
    /// `externalTrafficPolicy: Local`: which of `endpoints` are on this
    /// node (kube-proxy's own, by their EndpointSlice's nodeName). None:
    /// `Cluster`. iptables mode only.
    pub local_endpoints: Option<Vec<SocketAddr>>,
}

impl ServicePort {
    /// A ClusterIP Service `default/<name>` with one port named `p<port>`.
    pub fn cluster_ip(
        name: &str,
        cluster_ip: IpAddr,
        port: u16,
        protocol: Protocol,
        endpoints: Vec<SocketAddr>,
    ) -> Self {
        ServicePort {
            namespace: "default".into(),
            name: name.into(),
            port_name: format!("p{port}"),
            cluster_ip,
            port,
            protocol,
            node_port: None,
            endpoints,
            local_endpoints: None,
        }
    }

    /// The same Service, of type NodePort on `node_port`.
    pub fn with_node_port(mut self, node_port: u16) -> Self {
        self.node_port = Some(node_port);
        self
    }

    /// The same Service with `externalTrafficPolicy: Local`, `local` its
    /// endpoints on the node whose kube-proxy this is.
    pub fn with_local_external_traffic(mut self, local: Vec<SocketAddr>) -> Self {
        self.local_endpoints = Some(local);
        self
    }

    /// The KUBE-SEP chain of `endpoint`.
    fn sep_chain(&self, endpoint: SocketAddr) -> String {
        format!(
            "KUBE-SEP-{}",
            hash(
                &format!(
                    "{}{}{}",
                    self.port_name_string(),
                    self.protocol.upper(),
                    target(endpoint)
                ),
                16
            )
        )
    }

    /// "ns/svc:port", kube-proxy's ServicePortName.
    fn port_name_string(&self) -> String {
        format!("{}/{}:{}", self.namespace, self.name, self.port_name)
    }

    fn is_v6(&self) -> bool {
        self.cluster_ip.is_ipv6()
    }
}

/// kube-proxy's chain-name hash: base32 of the SHA-256 of the name,
/// truncated (16 characters in iptables mode, 8 in nftables mode).
fn hash(input: &str, len: usize) -> String {
    let digest = sha2::Sha256::digest(input.as_bytes());
    data_encoding::BASE32.encode(&digest)[..len].to_string()
}

/// `addr/32` or `addr/128`.
fn host_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// "ip:port" or "[ip]:port", as DNAT targets are written.
fn target(endpoint: SocketAddr) -> String {
    endpoint.to_string()
}

/// The node's kube-proxy: its mode and what it was told about the cluster.
pub struct KubeProxy {
    pub mode: Mode,
    /// `--cluster-cidr`, one per family.
    pub cluster_cidr_v4: String,
    pub cluster_cidr_v6: String,
    /// The Service CIDRs (nftables mode drops traffic to unallocated ones).
    pub service_cidr_v4: String,
    pub service_cidr_v6: String,
    /// The node's addresses that accept NodePorts (nftables' nodeport-ips;
    /// iptables mode matches any local address).
    pub node_addresses: Vec<IpAddr>,
}

const MASQ_MARK: &str = "0x4000";

impl KubeProxy {
    fn cluster_cidr(&self, v6: bool) -> &str {
        if v6 {
            &self.cluster_cidr_v6
        } else {
            &self.cluster_cidr_v4
        }
    }

    /// `iptables-restore --noflush` input for one family (the nat and
    /// filter tables), as kube-proxy's iptables proxier writes it.
    pub fn iptables_restore(&self, v6: bool, services: &[ServicePort]) -> String {
        let services: Vec<&ServicePort> = services.iter().filter(|s| s.is_v6() == v6).collect();
        let mut filter = String::from("*filter\n");
        for chain in [
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
        ] {
            filter.push_str(&format!(":{chain} - [0:0]\n"));
        }
        filter.push_str(
            "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
             -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
             -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
             -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n",
        );
        filter.push_str(&format!(
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT\n\
             -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n"
        ));
        // externalTrafficPolicy Local without an endpoint here: dropped.
        for svc in &services {
            if let (Some(node_port), Some(local)) = (svc.node_port, &svc.local_endpoints)
                && local.is_empty()
            {
                let proto = svc.protocol.name();
                filter.push_str(&format!(
                    "-A KUBE-EXTERNAL-SERVICES -m comment --comment \"{} has no local endpoints\" -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {node_port} -j DROP\n",
                    svc.port_name_string()
                ));
            }
        }
        filter.push_str("COMMIT\n");

        let mut chains = vec![
            "KUBE-SERVICES".to_string(),
            "KUBE-NODEPORTS".into(),
            "KUBE-POSTROUTING".into(),
            "KUBE-MARK-MASQ".into(),
        ];
        let mut rules = vec![
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_string(),
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".into(),
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING".into(),
            format!("-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"),
            format!("-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}"),
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into(),
            format!("-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"),
        ];
        for svc in &services {
            let name = svc.port_name_string();
            let proto = svc.protocol.name();
            let svc_chain = format!(
                "KUBE-SVC-{}",
                hash(&format!("{name}{}", svc.protocol.upper()), 16)
            );
            chains.push(svc_chain.clone());
            let vip = host_cidr(svc.cluster_ip);
            rules.push(format!(
                "-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" -m {proto} -p {proto} -d {vip} --dport {} -j {svc_chain}",
                svc.port
            ));
            rules.push(format!(
                "-A {svc_chain} -m comment --comment \"{name} cluster IP\" -m {proto} -p {proto} -d {vip} --dport {} ! -s {} -j KUBE-MARK-MASQ",
                svc.port,
                self.cluster_cidr(v6)
            ));
            if let Some(node_port) = svc.node_port {
                let ext_chain = format!(
                    "KUBE-EXT-{}",
                    hash(&format!("{name}{}", svc.protocol.upper()), 16)
                );
                chains.push(ext_chain.clone());
                rules.push(format!(
                    "-A KUBE-NODEPORTS -m comment --comment {name} -m {proto} -p {proto} --dport {node_port} -j {ext_chain}"
                ));
                match &svc.local_endpoints {
                    None => {
                        rules.push(format!(
                            "-A {ext_chain} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ"
                        ));
                        rules.push(format!("-A {ext_chain} -j {svc_chain}"));
                    }
                    Some(local) => {
                        // Pods' own traffic (kube-proxy's local-traffic
                        // detector by --cluster-cidr) and the node's go to
                        // every endpoint; the rest to this node's, the
                        // client's address kept.
                        rules.push(format!(
                            "-A {ext_chain} -m comment --comment \"pod traffic for {name} external destinations\" -s {} -j {svc_chain}",
                            self.cluster_cidr(v6)
                        ));
                        rules.push(format!(
                            "-A {ext_chain} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"
                        ));
                        rules.push(format!(
                            "-A {ext_chain} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {svc_chain}"
                        ));
                        if !local.is_empty() {
                            let svl_chain = format!(
                                "KUBE-SVL-{}",
                                hash(&format!("{name}{}", svc.protocol.upper()), 16)
                            );
                            chains.push(svl_chain.clone());
                            rules.push(format!("-A {ext_chain} -j {svl_chain}"));
                            for (i, endpoint) in local.iter().enumerate() {
                                let sep_chain = svc.sep_chain(*endpoint);
                                let comment = format!("\"{name} -> {}\"", target(*endpoint));
                                if i + 1 < local.len() {
                                    rules.push(format!(
                                        "-A {svl_chain} -m comment --comment {comment} -m statistic --mode random --probability {:.10} -j {sep_chain}",
                                        1.0 / (local.len() - i) as f64
                                    ));
                                } else {
                                    rules.push(format!(
                                        "-A {svl_chain} -m comment --comment {comment} -j {sep_chain}"
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            let count = svc.endpoints.len();
            for (i, endpoint) in svc.endpoints.iter().enumerate() {
                let sep_chain = svc.sep_chain(*endpoint);
                chains.push(sep_chain.clone());
                let comment = format!("\"{name} -> {}\"", target(*endpoint));
                if i + 1 < count {
                    rules.push(format!(
                        "-A {svc_chain} -m comment --comment {comment} -m statistic --mode random --probability {:.10} -j {sep_chain}",
                        1.0 / (count - i) as f64
                    ));
                } else {
                    rules.push(format!(
                        "-A {svc_chain} -m comment --comment {comment} -j {sep_chain}"
                    ));
                }
                rules.push(format!(
                    "-A {sep_chain} -m comment --comment {name} -s {} -j KUBE-MARK-MASQ",
                    host_cidr(endpoint.ip())
                ));
                rules.push(format!(
                    "-A {sep_chain} -m comment --comment {name} -m {proto} -p {proto} -j DNAT --to-destination {}",
                    target(*endpoint)
                ));
            }
        }
        // IPv6 has no route_localnet: kube-proxy keeps ::1 out of NodePorts.
        let local = if v6 {
            "-m addrtype --dst-type LOCAL ! -d ::1/128"
        } else {
            "-m addrtype --dst-type LOCAL"
        };
        rules.push(format!(
            "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" {local} -j KUBE-NODEPORTS"
        ));
        let mut nat = String::from("*nat\n");
        for chain in chains {
            nat.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for rule in rules {
            nat.push_str(&rule);
            nat.push('\n');
        }
        nat.push_str("COMMIT\n");
        filter + &nat
    }

    /// An `nft -f` script for one family's `kube-proxy` table, as
    /// kube-proxy's nftables proxier writes it.
    pub fn nft_script(&self, v6: bool, services: &[ServicePort]) -> String {
        let services: Vec<&ServicePort> = services.iter().filter(|s| s.is_v6() == v6).collect();
        let (family, ip, addr_type, service_cidr) = if v6 {
            ("ip6", "ip6", "ipv6_addr", &self.service_cidr_v6)
        } else {
            ("ip", "ip", "ipv4_addr", &self.service_cidr_v4)
        };
        let t = format!("{family} kube-proxy");
        let mut s = String::new();
        let mut line = |text: String| {
            s.push_str(&text);
            s.push('\n');
        };
        line(format!(
            "add table {t} {{ comment \"rules for kube-proxy\" ; }}"
        ));
        line(format!(
            "add set {t} cluster-ips {{ type {addr_type} ; comment \"Active ClusterIPs\" ; }}"
        ));
        line(format!(
            "add set {t} nodeport-ips {{ type {addr_type} ; comment \"IPs that accept NodePort traffic\" ; }}"
        ));
        line(format!(
            "add map {t} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}"
        ));
        line(format!(
            "add map {t} no-endpoint-services {{ type {addr_type} . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}"
        ));
        line(format!(
            "add map {t} service-ips {{ type {addr_type} . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}"
        ));
        line(format!(
            "add map {t} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}"
        ));
        for chain in [
            "cluster-ips-check",
            "mark-for-masquerade",
            "masquerading",
            "nodeport-endpoints-check",
            "services",
            "service-endpoints-check",
        ] {
            line(format!("add chain {t} {chain}"));
        }
        line(format!(
            "add chain {t} reject-chain {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"
        ));
        line(format!(
            "add chain {t} filter-forward {{ type filter hook forward priority 0 ; }}"
        ));
        line(format!(
            "add chain {t} filter-input {{ type filter hook input priority 0 ; }}"
        ));
        line(format!(
            "add chain {t} filter-output {{ type filter hook output priority 0 ; }}"
        ));
        line(format!(
            "add chain {t} nat-output {{ type nat hook output priority -100 ; }}"
        ));
        line(format!(
            "add chain {t} nat-postrouting {{ type nat hook postrouting priority 100 ; }}"
        ));
        line(format!(
            "add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}"
        ));
        line(format!(
            "add rule {t} cluster-ips-check {ip} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
        ));
        line(format!(
            "add rule {t} cluster-ips-check {ip} daddr {{ {service_cidr} }} drop comment \"Drop traffic to unallocated ClusterIPs\""
        ));
        line(format!(
            "add rule {t} filter-forward ct state new jump service-endpoints-check"
        ));
        line(format!(
            "add rule {t} filter-forward ct state new jump cluster-ips-check"
        ));
        line(format!(
            "add rule {t} filter-input ct state new jump nodeport-endpoints-check"
        ));
        line(format!(
            "add rule {t} filter-input ct state new jump service-endpoints-check"
        ));
        line(format!(
            "add rule {t} filter-output ct state new jump service-endpoints-check"
        ));
        line(format!(
            "add rule {t} filter-output ct state new jump cluster-ips-check"
        ));
        line(format!(
            "add rule {t} mark-for-masquerade mark set mark or {MASQ_MARK}"
        ));
        line(format!(
            "add rule {t} masquerading mark and {MASQ_MARK} == 0 return"
        ));
        line(format!(
            "add rule {t} masquerading mark set mark xor {MASQ_MARK}"
        ));
        line(format!("add rule {t} masquerading masquerade fully-random"));
        line(format!("add rule {t} nat-output jump services"));
        line(format!("add rule {t} nat-postrouting jump masquerading"));
        line(format!("add rule {t} nat-prerouting jump services"));
        line(format!(
            "add rule {t} nodeport-endpoints-check {ip} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"
        ));
        line(format!("add rule {t} reject-chain reject"));
        line(format!(
            "add rule {t} services {ip} daddr . meta l4proto . th dport vmap @service-ips"
        ));
        line(format!(
            "add rule {t} services {ip} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"
        ));
        line(format!(
            "add rule {t} service-endpoints-check {ip} daddr . meta l4proto . th dport vmap @no-endpoint-services"
        ));
        for address in self.node_addresses.iter().filter(|a| a.is_ipv6() == v6) {
            line(format!("add element {t} nodeport-ips {{ {address} }}"));
        }
        for svc in &services {
            let proto = svc.protocol.name();
            // kube-proxy: "<ns>/<svc>/<proto>/<port name>".
            let base = format!("{}/{}/{proto}/{}", svc.namespace, svc.name, svc.port_name);
            let svc_chain = format!("service-{}-{base}", hash(&base, 8));
            line(format!("add chain {t} {svc_chain}"));
            line(format!(
                "add rule {t} {svc_chain} {ip} daddr {} {ip} saddr != {} jump mark-for-masquerade",
                svc.cluster_ip,
                self.cluster_cidr(v6)
            ));
            let mut endpoint_chains = Vec::new();
            for endpoint in &svc.endpoints {
                // Chain names cannot hold ':': kube-proxy writes IPv6 with '.'.
                let dotted = endpoint.ip().to_string().replace(':', ".");
                let suffix = format!("{base}__{dotted}/{}", endpoint.port());
                let chain = format!("endpoint-{}-{suffix}", hash(&suffix, 8));
                line(format!("add chain {t} {chain}"));
                line(format!(
                    "add rule {t} {chain} {ip} saddr {} jump mark-for-masquerade",
                    endpoint.ip()
                ));
                line(format!(
                    "add rule {t} {chain} meta l4proto {proto} dnat to {}",
                    target(*endpoint)
                ));
                endpoint_chains.push(chain);
            }
            let choices: Vec<String> = endpoint_chains
                .iter()
                .enumerate()
                .map(|(i, chain)| format!("{i} : goto {chain}"))
                .collect();
            line(format!(
                "add rule {t} {svc_chain} numgen random mod {} vmap {{ {} }}",
                endpoint_chains.len(),
                choices.join(" , ")
            ));
            line(format!(
                "add element {t} cluster-ips {{ {} }}",
                svc.cluster_ip
            ));
            line(format!(
                "add element {t} service-ips {{ {} . {proto} . {} : goto {svc_chain} }}",
                svc.cluster_ip, svc.port
            ));
            if let Some(node_port) = svc.node_port {
                let ext_chain = format!("external-{}-{base}", hash(&base, 8));
                line(format!("add chain {t} {ext_chain}"));
                line(format!("add rule {t} {ext_chain} jump mark-for-masquerade"));
                line(format!("add rule {t} {ext_chain} goto {svc_chain}"));
                line(format!(
                    "add element {t} service-nodeports {{ {proto} . {node_port} : goto {ext_chain} }}"
                ));
            }
        }
        s
    }

    /// Programs `services` (both families) into the network namespace
    /// named `node` (as `ip netns` knows it).
    pub fn apply(&self, node: &str, services: &[ServicePort]) -> Result<(), String> {
        if self.mode == Mode::Nftables && services.iter().any(|s| s.local_endpoints.is_some()) {
            return Err(
                "externalTrafficPolicy Local: the fixture writes it in iptables mode only".into(),
            );
        }
        for v6 in [false, true] {
            match self.mode {
                Mode::Iptables => {
                    let tool = if v6 {
                        "ip6tables-restore"
                    } else {
                        "iptables-restore"
                    };
                    feed(
                        node,
                        &[tool, "--noflush"],
                        &self.iptables_restore(v6, services),
                    )?;
                }
                Mode::Nftables => {
                    let family = if v6 { "ip6" } else { "ip" };
                    // A full sync, as kube-proxy's first one: the table anew.
                    let _ = Command::new("ip")
                        .args([
                            "netns",
                            "exec",
                            node,
                            "nft",
                            "delete",
                            "table",
                            family,
                            "kube-proxy",
                        ])
                        .output();
                    feed(node, &["nft", "-f", "-"], &self.nft_script(v6, services))?;
                }
            }
        }
        Ok(())
    }
}

/// Runs `command` in the namespace `node` with `input` on stdin; its
/// stderr (and the input) when it fails.
fn feed(node: &str, command: &[&str], input: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", node])
        .args(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {command:?}: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(input.as_bytes())
        .map_err(|e| format!("writing rules to {command:?}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} refused the rules: {}\n{input}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(mode: Mode) -> KubeProxy {
        KubeProxy {
            mode,
            cluster_cidr_v4: "10.244.0.0/16".into(),
            cluster_cidr_v6: "fd44::/48".into(),
            service_cidr_v4: "10.96.0.0/16".into(),
            service_cidr_v6: "fd96::/108".into(),
            node_addresses: vec!["172.30.0.1".parse().unwrap()],
        }
    }

    fn three_backends() -> ServicePort {
        ServicePort::cluster_ip(
            "web",
            "10.96.0.10".parse().unwrap(),
            80,
            Protocol::Tcp,
            vec![
                "10.244.1.2:8080".parse().unwrap(),
                "10.244.1.3:8080".parse().unwrap(),
                "10.244.2.2:8080".parse().unwrap(),
            ],
        )
        .with_node_port(30080)
    }

    #[test]
    fn iptables_mode_has_kube_proxys_shapes() {
        let rules = proxy(Mode::Iptables).iptables_restore(false, &[three_backends()]);
        assert!(rules.contains("-A KUBE-SERVICES -m comment --comment \"default/web:p80 cluster IP\" -m tcp -p tcp -d 10.96.0.10/32 --dport 80 -j KUBE-SVC-"));
        assert!(rules.contains("--dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"));
        assert!(
            rules.contains("-m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-")
        );
        assert!(
            rules.contains("-m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-")
        );
        assert_eq!(rules.matches("-m statistic").count(), 2);
        assert!(rules.contains("-s 10.244.1.2/32 -j KUBE-MARK-MASQ"));
        assert!(rules.contains("-j DNAT --to-destination 10.244.2.2:8080"));
        assert!(rules.contains("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"));
        assert!(rules.contains("--dport 30080 -j KUBE-EXT-"));
        assert!(rules.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"));
        // The NodePort jump is the last rule of KUBE-SERVICES.
        let last = rules
            .lines()
            .rfind(|l| l.starts_with("-A KUBE-SERVICES"))
            .unwrap();
        assert!(last.contains("KUBE-NODEPORTS"));
    }

    #[test]
    fn local_external_traffic_has_kube_proxys_shapes() {
        let local = three_backends().with_local_external_traffic(vec![
            "10.244.1.2:8080".parse().unwrap(),
            "10.244.1.3:8080".parse().unwrap(),
        ]);
        let rules = proxy(Mode::Iptables).iptables_restore(false, std::slice::from_ref(&local));
        let ext = rules
            .lines()
            .filter(|l| l.starts_with("-A KUBE-EXT-"))
            .collect::<Vec<_>>();
        assert_eq!(ext.len(), 4, "{ext:#?}");
        assert!(ext[0].contains("pod traffic") && ext[0].contains("-s 10.244.0.0/16 -j KUBE-SVC-"));
        assert!(ext[1].contains("--src-type LOCAL -j KUBE-MARK-MASQ"));
        assert!(ext[2].contains("--src-type LOCAL -j KUBE-SVC-"));
        assert!(ext[3].contains("-j KUBE-SVL-"));
        assert_eq!(rules.matches("-A KUBE-SVL-").count(), 2);
        assert!(!rules.contains("masquerade traffic for"));
        assert!(!rules.contains("has no local endpoints"));
        // None here: dropped, and no KUBE-SVL chain.
        let none = three_backends().with_local_external_traffic(Vec::new());
        let rules = proxy(Mode::Iptables).iptables_restore(false, std::slice::from_ref(&none));
        assert!(rules.contains("has no local endpoints\" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP"));
        assert!(!rules.contains("KUBE-SVL-"));
        assert!(proxy(Mode::Nftables).apply("nowhere", &[none]).is_err());
    }

    #[test]
    fn nftables_mode_has_kube_proxys_shapes() {
        let script = proxy(Mode::Nftables).nft_script(false, &[three_backends()]);
        assert!(script.contains(
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips"
        ));
        assert!(script.contains("numgen random mod 3 vmap { 0 : goto endpoint-"));
        assert!(
            script
                .contains("ip daddr 10.96.0.10 ip saddr != 10.244.0.0/16 jump mark-for-masquerade")
        );
        assert!(script.contains("meta l4proto tcp dnat to 10.244.1.3:8080"));
        assert!(script.contains(
            "add element ip kube-proxy service-nodeports { tcp . 30080 : goto external-"
        ));
        assert!(script.contains("add element ip kube-proxy nodeport-ips { 172.30.0.1 }"));
    }

    #[test]
    fn ipv6_targets_are_bracketed() {
        let svc = ServicePort::cluster_ip(
            "dns",
            "fd96::a".parse().unwrap(),
            53,
            Protocol::Udp,
            vec!["[fd44:0:0:1::5]:53".parse().unwrap()],
        );
        let ipt = proxy(Mode::Iptables).iptables_restore(true, std::slice::from_ref(&svc));
        assert!(ipt.contains("-d fd96::a/128 --dport 53"));
        assert!(ipt.contains("--to-destination [fd44:0:0:1::5]:53"));
        assert!(ipt.contains("! -s fd44::/48"));
        let nft = proxy(Mode::Nftables).nft_script(true, &[svc]);
        assert!(nft.contains("add table ip6 kube-proxy"));
        assert!(nft.contains("dnat to [fd44:0:0:1::5]:53"));
        // The other family's services stay out.
        assert!(
            !proxy(Mode::Nftables)
                .nft_script(false, &[three_backends()])
                .contains("fd44")
        );
    }
}
