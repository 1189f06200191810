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
//!
//! A Service port is `ServicePort` (service.rs), the node's kube-proxy
//! `KubeProxy` (proxy.rs); its rules are written by iptables.rs and
//! nftables.rs with the names of names.rs, and put into the node by
//! apply.rs.

mod apply;
mod iptables;
mod names;
mod nftables;
mod proxy;
mod service;

pub use proxy::{KubeProxy, Mode};
pub use service::{Protocol, ServicePort};

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
