//! Hostile input, table-driven: each case gets the right CNI error code, a
//! message that names the problem, a clean exit (status 1: no panic, no
//! signal), and leaves the node exactly as it was.
//!
//! "The node" is a private one, so the before/after comparison can be exact
//! even while other tests or people use the machine: a network namespace
//! plus a private mount namespace with its own bpffs (held by a sleeping
//! process), running a live pod of the network under attack. Every call is
//! made inside it with nsenter; the snapshot covers its links, addresses,
//! routes, neighbours, qdiscs and tc filters, every pinned file under its
//! /sys/fs/bpf, the endpoint and host-veth maps (bpftool), and the IPAM data
//! dir.
//!
//! The cases are in `stdin` and `environment`, what a case is and how its
//! outcome is judged in `case`; the private node, the calls into it and
//! its snapshots are in `node`.

use flatnet_tests::*;

mod case;
mod environment;
mod node;
mod stdin;

use case::{Case, check_outcome};
use node::{PrivateNode, base_env, env_for, first_difference, invoke, settled_snapshot, snapshot};

#[flatnet_test(root)]
fn hostile_input_is_refused_precisely_and_changes_nothing() {
    let node = PrivateNode::new();
    let net = Network::flatnet_ipam();
    // A live pod on the node, so there is state to disturb.
    let pod_ns = Netns::new();
    let target_ns = Netns::new();
    let flatnet = bin("flatnet");
    let mut pod_env = env_for(&base_env(&pod_ns.path()), &[]);
    pod_env[1].1 = Some("hostile-pod".into());
    let out = invoke(&node, &flatnet, &pod_env, &net.stdin());
    assert!(out.success(), "the node's pod: {out:?}");
    let before = settled_snapshot(&node, &net);
    assert!(
        before.contains("\"key\""),
        "the endpoint map is readable: {before}"
    );
    assert!(net.ipam_allocations().len() == 1);

    let base = base_env(&target_ns.path());
    let mut failures = Vec::new();
    let all = cases(&net);
    let count = all.len();
    for case in all {
        let env = env_for(&base, &case.env);
        let out = invoke(&node, &bin(case.plugin), &env, &case.stdin);
        let problem = check_outcome(&case, &out);
        let after = snapshot(&node, &net);
        let problem = problem.or_else(|| {
            (after != before)
                .then(|| format!("the node changed: {}", first_difference(&before, &after)))
        });
        if let Some(problem) = problem {
            eprintln!("FAILED {}: {problem}\n  {out:?}", case.name);
            failures.push(format!("{}: {problem}", case.name));
        } else {
            let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
            eprintln!("ok {:<45} code {} {msg}", case.name, case.code);
        }
    }

    // The pod is still served, then leaves cleanly.
    pod_env[0].1 = Some("DEL".into());
    let out = invoke(&node, &flatnet, &pod_env, &net.stdin());
    assert!(out.success(), "DEL of the node's pod: {out:?}");
    assert!(net.ipam_allocations().is_empty());
    assert!(
        failures.is_empty(),
        "{} of {count} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every case, in the order they run.
fn cases(net: &Network) -> Vec<Case> {
    let mut cases = stdin::decoding(net);
    cases.extend(environment::variables(net));
    cases.extend(stdin::configuration(net));
    cases.extend(environment::arguments_and_verbs(net));
    cases.extend(environment::each_verb(net));
    cases.extend(stdin::oversized_and_flatnet_ipam(net));
    cases
}
