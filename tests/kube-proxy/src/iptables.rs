//! kube-proxy's iptables mode: one family's `iptables-restore --noflush`
//! input (the nat and filter tables), as its iptables proxier writes it.

use crate::names::{hash, host_cidr, target};
use crate::proxy::{KubeProxy, MASQ_MARK};
use crate::service::ServicePort;

impl KubeProxy {
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
}
