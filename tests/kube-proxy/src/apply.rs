//! The rules put into a node: each family's rule set fed to the real
//! `iptables-restore`/`ip6tables-restore` (iptables-nft) or `nft` inside
//! the node's network namespace, so that they go with it.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::proxy::{KubeProxy, Mode};
use crate::service::ServicePort;

impl KubeProxy {
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
