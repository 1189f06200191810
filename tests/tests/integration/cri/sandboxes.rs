//! Sandboxes through containerd's CRI plugin: their addresses in the CRI
//! status, both families, traffic between them, teardown, a containerd
//! restart, 32 at once.

use std::collections::HashSet;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use flatnet_tests::cri::PodSpec;
use flatnet_tests::*;
use k8s_cri::v1::PodSandboxState;

use super::node::{Node, cri_tools};
use super::sandbox::{
    Sandbox, assert_no_sandboxes, fetch_busybox, http_get, in_netns, stop_and_remove,
};

#[flatnet_test(root, tools = cri_tools())]
fn sandbox_ip_in_cri_status_is_flatnets() {
    let node = Node::new(false);
    let client = node.client();
    let sandbox = node.run_sandbox(&client, "v4");
    let ip = sandbox.ip();
    assert!(ip.is_ipv4(), "{ip}");
    assert!(
        ip.to_string().starts_with(&format!("{}.", node.prefix)),
        "{ip} is not in the node's pod CIDR {}.0/24",
        node.prefix
    );
    assert!(
        sandbox.status.additional_ips.is_empty(),
        "{:?}",
        sandbox.status
    );
    assert_eq!(sandbox.addresses_inside(), vec![ip], "eth0 in the sandbox");
    assert_eq!(node.allocations(), vec![ip], "flatnet-ipam's store");
    assert!(
        node.datapath().endpoint(ip).expect("endpoint").is_some(),
        "no datapath endpoint for {ip}"
    );
    // The sandbox process is in that netns.
    let pid = sandbox.status.pid.expect("the sandbox's pid");
    let inode =
        |path: &Path| std::fs::metadata(path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    assert_eq!(
        inode(Path::new(&format!("/proc/{pid}/ns/net"))).expect("ns of the pid"),
        inode(&sandbox.netns).expect("netns file"),
        "the sandbox's pid is not in its netns"
    );

    stop_and_remove(&client, &sandbox);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[sandbox], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn dual_stack_sandbox_reports_both_families_ipv4_first() {
    let node = Node::new(true);
    let client = node.client();
    let sandbox = node.run_sandbox(&client, "dual");
    let ips = sandbox.ips();
    assert_eq!(ips.len(), 2, "{:?}", sandbox.status);
    assert!(ips[0].is_ipv4(), "the primary IP is IPv4: {ips:?}");
    assert!(ips[1].is_ipv6(), "the additional IP is IPv6: {ips:?}");
    let mut inside = sandbox.addresses_inside();
    inside.sort();
    let mut expected = ips.clone();
    expected.sort();
    assert_eq!(inside, expected, "eth0 in the sandbox");
    assert_eq!(node.allocations(), expected, "flatnet-ipam's store");
    for ip in &ips {
        assert!(
            node.datapath().endpoint(*ip).expect("endpoint").is_some(),
            "no datapath endpoint for {ip}"
        );
    }

    stop_and_remove(&client, &sandbox);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[sandbox], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn containers_in_two_sandboxes_talk_tcp_both_ways_through_the_redirect() {
    let node = Node::new(false);
    let client = node.client();
    let a = node.run_sandbox(&client, "a");
    let b = node.run_sandbox(&client, "b");
    let httpd_a = node.start_httpd(&client, &a);
    let httpd_b = node.start_httpd(&client, &b);
    let before = node.redirected_bytes();
    fetch_busybox(&client, &httpd_a, b.ip());
    fetch_busybox(&client, &httpd_b, a.ip());
    let redirected = node.redirected_bytes() - before;
    let file = std::fs::metadata("/bin/busybox").expect("busybox").len();
    eprintln!("{redirected} bytes redirected for two fetches of {file} bytes");
    assert!(
        redirected > 3 * file / 2,
        "only {redirected} bytes went through the redirect"
    );

    // Stop, then Remove, one at a time: the first leaves the network up.
    stop_and_remove(&client, &a);
    node.assert_cleaned_up(std::slice::from_ref(&a), false);
    assert!(node.datapath().exists(), "pins went with a pod still there");
    assert!(link_exists(&b.host_veth));
    stop_and_remove(&client, &b);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[a, b], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn stop_and_remove_leave_nothing_behind() {
    let node = Node::new(true);
    let client = node.client();
    let sandboxes: Vec<Sandbox> = (0..3)
        .map(|i| node.run_sandbox(&client, &format!("p{i}")))
        .collect();
    // A running container in the sandbox: Stop must take it down too.
    let _httpd = node.start_httpd(&client, &sandboxes[0]);
    assert_eq!(node.allocations().len(), 6, "two addresses per sandbox");
    // StopPodSandbox alone already tears the network down (CNI DEL);
    // RemovePodSandbox must not trip over that.
    client.stop_pod_sandbox(&sandboxes[0].id).expect("stop");
    assert!(
        wait_link_gone(&sandboxes[0].host_veth, Duration::from_secs(10)),
        "StopPodSandbox left the host veth"
    );
    assert_eq!(
        node.allocations().len(),
        4,
        "StopPodSandbox freed both addresses"
    );
    let stopped = client.pod_sandbox_status(&sandboxes[0].id).expect("status");
    assert_eq!(stopped.state, PodSandboxState::SandboxNotready);
    // A second Stop is a no-op for CNI (kubelet repeats it).
    client
        .stop_pod_sandbox(&sandboxes[0].id)
        .expect("stop again");
    for sandbox in &sandboxes {
        stop_and_remove(&client, sandbox);
    }
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&sandboxes, true);
}

#[flatnet_test(root, tools = cri_tools())]
fn sandboxes_survive_a_containerd_sigkill_and_restart() {
    let mut node = Node::new(false);
    let (a, b, httpd_a, httpd_b) = {
        let client = node.client();
        let a = node.run_sandbox(&client, "a");
        let b = node.run_sandbox(&client, "b");
        let httpd_a = node.start_httpd(&client, &a);
        let httpd_b = node.start_httpd(&client, &b);
        fetch_busybox(&client, &httpd_a, b.ip());
        (a, b, httpd_a, httpd_b)
    };
    node.containerd
        .as_mut()
        .expect("containerd")
        .kill_and_restart()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let client = node.client();
    for sandbox in [&a, &b] {
        let status = client.pod_sandbox_status(&sandbox.id).expect("status");
        assert_eq!(status.state, PodSandboxState::SandboxReady, "{status:?}");
        assert_eq!(status.ip, sandbox.status.ip, "the IP after the restart");
        assert!(link_exists(&sandbox.host_veth));
    }
    let before = node.redirected_bytes();
    fetch_busybox(&client, &httpd_a, b.ip());
    fetch_busybox(&client, &httpd_b, a.ip());
    assert!(
        node.redirected_bytes() - before
            > std::fs::metadata("/bin/busybox").expect("busybox").len(),
        "the traffic after the restart did not take the redirect"
    );
    assert_eq!(node.allocations().len(), 2);
    for sandbox in [&a, &b] {
        stop_and_remove(&client, sandbox);
    }
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[a, b], true);
}

#[flatnet_test(root, tools = cri_tools())]
fn thirty_two_sandboxes_at_once_get_distinct_addresses_and_reach_each_other() {
    const PODS: usize = 32;
    let node = Node::new(false);
    let client = node.client();
    let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&format!("c{i}"))).collect();
    let started = Instant::now();
    let ids: Vec<String> = client
        .run_pod_sandboxes(&pods)
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e:#}\n{}", node.containerd().log_tail())))
        .collect();
    eprintln!("{PODS} concurrent RunPodSandbox in {:?}", started.elapsed());
    let sandboxes: Vec<Sandbox> = ids
        .into_iter()
        .map(|id| node.sandbox(&client, id))
        .collect();
    let ips: HashSet<IpAddr> = sandboxes.iter().map(Sandbox::ip).collect();
    assert_eq!(ips.len(), PODS, "addresses are not distinct");
    let mut held = node.allocations();
    held.sort();
    let mut expected: Vec<IpAddr> = ips.iter().copied().collect();
    expected.sort();
    assert_eq!(
        held, expected,
        "flatnet-ipam holds exactly the sandboxes' addresses"
    );
    assert_eq!(
        node.datapath().all_endpoints().expect("endpoints").len(),
        PODS
    );
    for sandbox in &sandboxes {
        assert_eq!(
            sandbox.addresses_inside(),
            vec![sandbox.ip()],
            "{}",
            sandbox.id
        );
    }

    // Every other sandbox fetches a file from the httpd in the first one
    // (from its netns), and the first one's container fetches from
    // listeners in a sample of the others.
    let server = &sandboxes[0];
    let httpd = node.start_httpd(&client, server);
    let server_addr = SocketAddr::new(server.ip(), 8080);
    wait_until("the httpd to listen", Duration::from_secs(10), || {
        in_netns(&sandboxes[1].netns, || {
            http_get(server_addr, "/etc/passwd").is_ok()
        })
    });
    let before = node.redirected_bytes();
    std::thread::scope(|scope| {
        for sandbox in &sandboxes[1..] {
            scope.spawn(move || {
                let response = in_netns(&sandbox.netns, || http_get(server_addr, "/etc/passwd"))
                    .unwrap_or_else(|e| panic!("{} to {server_addr}: {e}", sandbox.ip()));
                let text = String::from_utf8_lossy(&response);
                assert!(text.contains("root:x:0:0"), "{}: {text}", sandbox.ip());
            });
        }
    });
    for sandbox in sandboxes.iter().skip(1).step_by(7) {
        let listener = in_netns(&sandbox.netns, || {
            std::net::TcpListener::bind((sandbox.ip(), 9000)).expect("listen")
        });
        let accept = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut got = String::new();
            conn.read_to_string(&mut got).expect("read");
            got
        });
        let (code, _, stderr) = client
            .exec_sync(
                &httpd,
                &[
                    "sh",
                    "-c",
                    &format!("echo hello | nc {} 9000", sandbox.ip()),
                ],
                Duration::from_secs(10),
            )
            .expect("exec nc");
        assert_eq!(
            code,
            0,
            "nc to {}: {}",
            sandbox.ip(),
            String::from_utf8_lossy(&stderr)
        );
        assert_eq!(accept.join().expect("accept thread").trim(), "hello");
    }
    assert!(
        node.redirected_bytes() > before,
        "no traffic took the redirect"
    );

    let started = Instant::now();
    let ids: Vec<String> = sandboxes.iter().map(|s| s.id.clone()).collect();
    for (id, result) in ids.iter().zip(client.stop_and_remove_pod_sandboxes(&ids)) {
        result.unwrap_or_else(|e| panic!("{id}: {e:#}"));
    }
    eprintln!(
        "{PODS} concurrent Stop+RemovePodSandbox in {:?}",
        started.elapsed()
    );
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&sandboxes, true);
}
