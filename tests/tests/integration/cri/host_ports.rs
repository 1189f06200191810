//! hostPort through portmap chained after flatnet: from the node, other pods
//! and outside, and nothing left behind.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use flatnet_tests::containerd::BUSYBOX_IMAGE;
use flatnet_tests::cri::{CriClient, PodSpec};
use flatnet_tests::*;
use k8s_cri::v1::{PortMapping, Protocol};

use super::node::{Node, NodeNs, assert_node_gone, cri_tools, host_rules};
use super::sandbox::{Sandbox, assert_no_sandboxes, http_get, in_netns, stop_and_remove};

impl Node {
    fn node_ns(&self) -> &NodeNs {
        self.ns.as_ref().expect("a simulated node")
    }

    /// The node namespace's netfilter rules as iptables-nft and nft show
    /// them (portmap writes through iptables-nft).
    fn rules(&self) -> String {
        format!(
            "{}{}",
            self.exec(&["iptables-save"]),
            self.exec(&["nft", "list", "ruleset"])
        )
    }

    /// A busybox httpd on :8080 in the sandbox serving `/token`: `token`.
    fn start_token_httpd(&self, client: &CriClient, sandbox: &Sandbox, token: &str) -> String {
        let script =
            format!("mkdir -p /www && echo {token} > /www/token && exec httpd -f -p 8080 -h /www");
        let container = client
            .create_and_start_container(&sandbox.id, "web", BUSYBOX_IMAGE, &["sh", "-c", &script])
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.containerd().log_tail()));
        let own = SocketAddr::new(sandbox.ip(), 8080);
        wait_until("the token httpd to listen", Duration::from_secs(10), || {
            in_netns(&sandbox.netns, || http_get(own, "/token")).is_ok()
        });
        container
    }
}

/// The body of an HTTP/1.0 response.
fn body(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.trim().to_string())
        .unwrap_or_else(|| format!("<no body in {text:?}>"))
}

#[flatnet_test(root, tools = cri_tools())]
fn host_port_reaches_the_pod_from_the_node_other_pods_and_outside() {
    let node = Node::simulated();
    let ns = node.node_ns();
    let client = node.client();
    let host_port = 30000 + (node.index % 2000) as u16;
    let mut web_pod = PodSpec::new("web");
    web_pod.port_mappings = vec![PortMapping {
        protocol: Protocol::Tcp as i32,
        container_port: 8080,
        host_port: i32::from(host_port),
        host_ip: String::new(),
    }];
    let web = node.run_pod(&client, &web_pod);
    // The other pod serves a token of its own on the same container port:
    // a hostPort that reached the wrong pod would show it.
    let other = node.run_sandbox(&client, "other");
    let (web_token, other_token) = (unique("web-token-"), unique("other-token-"));
    node.start_token_httpd(&client, &web, &web_token);
    let other_httpd = node.start_token_httpd(&client, &other, &other_token);

    // portmap's rules are in the node's namespace, none in the test process's.
    let rules = node.rules();
    assert!(
        rules.contains(&web.id) && rules.contains(&format!("--dport {host_port}")),
        "no portmap rule for {} in the node:\n{rules}",
        web.id
    );
    let host = host_rules();
    for ours in [&web.id, &node.network] {
        assert!(
            !host.contains(ours.as_str()),
            "{ours} in the host's rules:\n{host}"
        );
    }

    let target = SocketAddr::from((ns.address, host_port));
    let fetch = |netns: &Path, to: SocketAddr| -> String {
        in_netns(netns, || http_get(to, "/token"))
            .map(|response| body(&response))
            .unwrap_or_else(|e| panic!("GET {to}/token from {}: {e}", netns.display()))
    };
    // From the node itself: its address, and loopback (portmap's snat).
    let localhost = SocketAddr::from((Ipv4Addr::LOCALHOST, host_port));
    for to in [target, localhost] {
        assert_eq!(fetch(&ns.netns.path(), to), web_token, "node -> {to}");
    }
    // From outside the node (another node, a load balancer).
    assert_eq!(
        fetch(&ns.outside.path(), target),
        web_token,
        "outside -> {target}"
    );
    // From another pod on the node: the test process in its netns, and its
    // container (ExecSync). portmap's hairpin rule masquerades sources in
    // the pod CIDR, so the reply goes to the node's address via the stack.
    assert_eq!(fetch(&other.netns, target), web_token, "pod -> {target}");
    let (code, stdout, stderr) = client
        .exec_sync(
            &other_httpd,
            &["wget", "-q", "-O", "-", &format!("http://{target}/token")],
            Duration::from_secs(10),
        )
        .expect("exec wget");
    assert_eq!(
        code,
        0,
        "wget {target}: {}",
        String::from_utf8_lossy(&stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&stdout).trim(),
        web_token,
        "container -> {target}"
    );

    stop_and_remove(&client, &web);
    node.assert_cleaned_up(std::slice::from_ref(&web), false);
    // Refused: nothing listens on the node's port, and no rule leads on.
    for from in [ns.netns.path(), other.netns.clone(), ns.outside.path()] {
        let answer = in_netns(&from, || http_get(target, "/token"));
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
            "{target} from {} after the pod went: {answer:?}",
            from.display()
        );
    }
    let rules = node.rules();
    assert!(
        !rules.contains(&web.id) && !rules.contains(&format!("--dport {host_port}")),
        "portmap's rules for {} left in the node:\n{rules}",
        web.id
    );
    // The other pod is still served.
    assert_eq!(
        fetch(&ns.netns.path(), SocketAddr::new(other.ip(), 8080)),
        other_token
    );
    stop_and_remove(&client, &other);
    assert_no_sandboxes(&client);
    node.assert_cleaned_up(&[web, other], true);
    assert_node_gone(node);
}
