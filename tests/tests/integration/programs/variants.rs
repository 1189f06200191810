//! The measurement's cut-down `from_pod` (`cost_variant`, timed by `cargo
//! xtask bench`): each variant leaves out its part and only that, and the
//! verifier prunes what a variant does not run (which is why the deployed
//! program, variant 0, pays nothing for the others).

use std::path::Path;

use super::*;
use flatnet_common::cost_variant;

/// Each variant of this build in turn, first at the tcx ingress of pod
/// a's host veth (its link and a pin of the program under the scratch
/// root): `check` runs frames through it.
fn with_variant(node: &Node, variant: u32, check: impl FnOnce(&Path) -> u32) {
    // bpffs refuses names with a dot.
    let (link, program) = (
        node.scratch.program_path("variant-link"),
        node.scratch.program_path("variant-prog"),
    );
    let loaded = node
        .netns
        .run(|| {
            node.scratch
                .datapath
                .attach_cost_variant(variant, "host-a", &link)
        })
        .expect("attaching the variant");
    bpftool(
        &["prog", "pin", "id", &loaded.program_id.to_string()],
        &program,
    );
    let instructions = check(&program);
    let _ = std::fs::remove_file(&program);
    std::fs::remove_file(&link).expect("removing the variant's link");
    assert_eq!(
        loaded.instructions, instructions,
        "variant {variant}: instructions kept"
    );
}

/// bpftool with `args` and then `path`, in the host's mount namespace
/// (`ip netns exec` would hide the bpffs).
fn bpftool(args: &[&str], path: &Path) -> String {
    flatnet_tests::bpftool_ok(std::process::Command::new("bpftool").args(args).arg(path))
}

#[flatnet_test(root, tools = ["bpftool", "conntrack"])]
fn each_variant_leaves_out_its_part_and_the_verifier_prunes_the_rest() {
    let node = Node::new(DatapathMode::Tc);
    let (a, b) = (&node.a, &node.b);
    let family = Family::V4;
    let to_b = a.sends(Tuple::new(a.ip(family), 40000, b.ip(family), 8080).udp());
    let spoofed = a.sends(Tuple::new(UNUSED.of(family), 40000, b.ip(family), 8080).udp());
    // A reply of a flow the host translated (b is a Service's backend):
    // the stack's, unless the flow is not asked about.
    let translated_reply = Tuple::new(b.ip(family), BACKEND_PORT, a.ip(family), 40001);
    node.track(
        "udp",
        Tuple::new(a.ip(family), 40001, CLUSTER_IP.of(family), SERVICE_PORT),
        translated_reply,
    );
    let reply = b.sends(translated_reply.udp());
    let run = |program: &Path, frame: &[u8], sender: &Pod| {
        node.netns
            .run(|| run_tc(program, frame, sender.host_ifindex))
            .expect("a test run of the variant")
            .verdict
    };
    let deployed = node.scratch.program_path(PROG_FROM_POD);
    let instructions_of = |program: &Path| -> u32 {
        let shown = bpftool(&["prog", "show", "-j", "pinned"], program);
        let json: serde_json::Value = serde_json::from_str(&shown).expect("bpftool's JSON");
        json["bytes_xlated"].as_u64().expect("bytes_xlated") as u32 / 8
    };
    let full = instructions_of(&deployed);
    let mut kept = Vec::new();
    for (variant, name) in cost_variant::NAMES {
        with_variant(&node, variant, |program| {
            let before = node.stats();
            let (normal, spoof, translated) = (
                run(program, &to_b, a),
                run(program, &spoofed, a),
                run(program, &reply, b),
            );
            let counted = node.counted_since(&before);
            let expected = match variant {
                cost_variant::RETURN => (TC_NEXT, TC_NEXT, TC_NEXT),
                // No source check, no flow: everything for a local pod goes in.
                cost_variant::REDIRECT_ONLY => (TC_ACT_REDIRECT, TC_ACT_REDIRECT, TC_ACT_REDIRECT),
                // The translated flow's reply is "clear" without its verdict.
                cost_variant::NO_FLOW => (TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_REDIRECT),
                _ => (TC_ACT_REDIRECT, TC_ACT_SHOT, TC_NEXT),
            };
            assert_eq!((normal, spoof, translated), expected, "{name}: verdicts");
            let counts = !matches!(
                variant,
                cost_variant::RETURN | cost_variant::REDIRECT_ONLY | cost_variant::NO_COUNTERS
            );
            assert_eq!(!counted.is_empty(), counts, "{name}: STATS {counted:?}");
            let instructions = instructions_of(program);
            kept.push((name, instructions));
            instructions
        });
    }
    println!("instructions kept: deployed {full}, variants {kept:?}");
    for (name, instructions) in &kept {
        match *name {
            // Variant 0 is the deployed program, to the instruction.
            "full" => assert_eq!(*instructions, full, "full"),
            "return" => assert!(*instructions < 16, "return: {instructions}"),
            "redirect-only" => assert!(*instructions < full / 10, "redirect-only: {instructions}"),
            _ => assert!(*instructions < full, "{name}: {instructions} of {full}"),
        }
    }
}
