//! kube-proxy's nftables mode: one family's `kube-proxy` table as an
//! `nft -f` script, as its nftables proxier writes it.

use crate::names::{hash, target};
use crate::proxy::{KubeProxy, MASQ_MARK};
use crate::service::ServicePort;

impl KubeProxy {
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
}
