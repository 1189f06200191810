//! Policy by peer identity: a pod's table names identities, the node maps
//! peer addresses to them, and the programs allow what the longest prefix
//! allows together with what the peer's identity is allowed. A peer that
//! leaves an identity loses what it allowed, for new flows at once and
//! for recorded ones once the pod's flows are judged again.

use flatnet::config::DatapathMode;
use flatnet_datapath::bpf::{PeerRule, PolicyPorts, PolicyTable};
use flatnet_tests::flatnet_test;
use flatnet_tests::frames::*;
use flatnet_tests::test_run::{TC_ACT_REDIRECT, TC_ACT_SHOT};

use super::fixture::{rule, tcp_port};
use crate::programs::cross_node::from_remote;
use crate::programs::{FAMILIES, Hook, Node, REMOTE_POD, TTL, Tuple};

const CLIENTS: u32 = 7;
const OTHERS: u32 = 8;

#[flatnet_test(root)]
fn policy_egress_by_identity_allows_the_identitys_pods_on_its_ports() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    // The pod subnet explicitly denied by prefix (an ipBlock's except):
    // the identity's entry allows B all the same.
    let rules = [rule("10.244.0.0/16", &[]), rule("fd00:244::/32", &[])];
    let peers = [PeerRule {
        identity: CLIENTS,
        ports: PolicyPorts::Ranges(vec![tcp_port(8080)]),
    }];
    node.set_tables(
        a,
        None,
        Some(PolicyTable {
            rules: &rules,
            peers: &peers,
        }),
    );
    let read = node.scratch.datapath.pod_policy_peers(a.slot).unwrap();
    assert_eq!(read, [(1, peers[0].clone())], "egress is direction 1");

    // B has no identity yet: denied.
    for family in FAMILIES {
        let frame = a.sends(Tuple::new(a.ip(family), 40000, b.ip(family), 8080).tcp(TCP_SYN));
        node.pod_to_pod(
            &format!("{family:?} A to B before B has an identity"),
            (a, b),
            &frame,
            false,
        );
    }
    node.name_pod(b, CLIENTS);
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let frame = a.sends(Tuple::new(ai, 40001, bi, 8080).tcp(TCP_SYN));
        node.pod_to_pod(
            &format!("{family:?} A to B, a client, on 8080"),
            (a, b),
            &frame,
            true,
        );
        let frame = a.sends(Tuple::new(ai, 40002, bi, 9090).tcp(TCP_SYN));
        node.pod_to_pod(&format!("{family:?} A to B on 9090"), (a, b), &frame, false);
    }

    // B leaves the identity: a new flow is denied at once; the recorded
    // one (40001) passes until A's flows are judged again.
    node.name_pod(b, OTHERS);
    for family in FAMILIES {
        let (ai, bi) = (a.ip(family), b.ip(family));
        let frame = a.sends(Tuple::new(ai, 40003, bi, 8080).tcp(TCP_SYN));
        node.pod_to_pod(
            &format!("{family:?} a new flow once B left"),
            (a, b),
            &frame,
            false,
        );
        let frame = a.sends(Tuple::new(ai, 40001, bi, 8080).tcp(TCP_ACK));
        node.pod_to_pod(
            &format!("{family:?} the recorded flow, not judged again yet"),
            (a, b),
            &frame,
            true,
        );
    }
    node.scratch.datapath.rejudge_pod_flows(a.slot).unwrap();
    for family in FAMILIES {
        let frame = a.sends(Tuple::new(a.ip(family), 40001, b.ip(family), 8080).tcp(TCP_ACK));
        node.pod_to_pod(
            &format!("{family:?} the recorded flow judged again"),
            (a, b),
            &frame,
            false,
        );
    }
    assert_eq!(node.policy_drops(a), (0, 8));

    // Not isolated any more: its identity entries go with it.
    node.scratch.datapath.clear_pod_policy(a.slot).unwrap();
    assert!(
        node.scratch
            .datapath
            .pod_policy_peers(a.slot)
            .unwrap()
            .is_empty()
    );
    node.scratch
        .datapath
        .remove_peer_ids(&FAMILIES.map(|f| b.ip(f)))
        .unwrap();
    assert!(node.scratch.datapath.peer_ids().unwrap().is_empty());
}

#[flatnet_test(root)]
fn policy_ingress_by_identity_admits_another_nodes_pod_once_it_has_the_identity() {
    let node = Node::new(DatapathMode::Tc);
    let b = &node.b;
    let peers = [PeerRule {
        identity: CLIENTS,
        ports: PolicyPorts::Any,
    }];
    node.set_tables(
        b,
        Some(PolicyTable {
            rules: &[],
            peers: &peers,
        }),
        None,
    );
    for family in FAMILIES {
        let frame = from_remote(REMOTE_POD.of(family), b.ip(family), TTL);
        let outcome = node.try_run(Hook::Uplink, &frame).unwrap();
        assert_eq!(outcome.verdict, TC_ACT_SHOT, "{family:?} no identity yet");
    }
    let remote: Vec<_> = FAMILIES
        .iter()
        .map(|f| (REMOTE_POD.of(*f), CLIENTS))
        .collect();
    node.scratch.datapath.write_peer_ids(&remote).unwrap();
    for family in FAMILIES {
        let (src, dst) = (REMOTE_POD.of(family), b.ip(family));
        let forwarded = b.receives(&from_remote(src, dst, TTL - 1));
        node.check(
            &format!("{family:?} a client on another node to B"),
            Hook::Uplink,
            &from_remote(src, dst, TTL),
            TC_ACT_REDIRECT,
            &forwarded,
            &[("uplink_to_pod", 1)],
        );
    }
    assert_eq!(node.policy_drops(b), (2, 0));
    node.scratch
        .datapath
        .remove_peer_ids(&remote.iter().map(|(a, _)| *a).collect::<Vec<_>>())
        .unwrap();
}

#[flatnet_test(root)]
fn policy_rewrites_with_the_previous_tables_delete_exactly_the_stale_entries() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let datapath = &node.scratch.datapath;
    let peer = |identity| PeerRule {
        identity,
        ports: PolicyPorts::Any,
    };
    let (old_rules, old_peers) = ([rule("10.244.0.0/16", &[tcp_port(8080)])], [peer(CLIENTS)]);
    let (new_rules, new_peers) = ([rule("fd00:244::/32", &[tcp_port(8080)])], [peer(OTHERS)]);
    let old = PolicyTable {
        rules: &old_rules,
        peers: &old_peers,
    };
    let new = PolicyTable {
        rules: &new_rules,
        peers: &new_peers,
    };
    node.set_tables(a, None, Some(old));
    // B's entries are the same keys but B's slot: left alone.
    node.set_tables(b, None, Some(old));
    node.netns
        .run(|| datapath.replace_pod_tables(a.slot, Some([None, Some(old)]), [None, Some(new)]))
        .expect("rewriting A's tables");
    let prefixes: Vec<String> = datapath
        .pod_policy_rules(a.slot)
        .unwrap()
        .iter()
        .map(|(_, r)| r.cidr.to_string())
        .collect();
    assert_eq!(prefixes, ["fd00:244::/32"]);
    assert_eq!(
        datapath.pod_policy_peers(a.slot).unwrap(),
        [(1, peer(OTHERS))]
    );
    assert_eq!(datapath.pod_policy_rules(b.slot).unwrap().len(), 1);
    assert_eq!(
        datapath.pod_policy_peers(b.slot).unwrap(),
        [(1, peer(CLIENTS))]
    );
}
