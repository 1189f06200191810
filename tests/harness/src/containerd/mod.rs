//! containerd's configuration as every containerd of this project runs it:
//! containerd 1.6's (`version = 2`) for the CRI suites (a containerd per
//! test) and the image check, containerd 2's (`version = 3`, [`v3`]) for
//! the real cluster's nodes (`cargo xtask e2e`). What this
//! machine kind needs is said once here: the snapshotters that cannot work
//! are off, and the CRI plugin restricts oom_score_adj (this machine refuses
//! a negative one, which every sandbox asks for).

mod v3;

use std::fmt::Write as _;
use std::path::PathBuf;

/// Where a containerd keeps its state, when not at its defaults
/// (/var/lib/containerd, /run/containerd, /run/containerd/containerd.sock).
pub struct StatePaths {
    pub root: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    /// The `opt` plugin's folder (default /opt/containerd).
    pub opt: PathBuf,
}

/// The CRI plugin, as kubelet uses it.
pub struct Cri {
    /// The pod sandbox image (kubelet 1.20's default is k8s.gcr.io/pause:3.2).
    pub sandbox_image: String,
    pub cni_bin_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    /// runc's binary and its state folder; None: runc on PATH and its default.
    pub runc: Option<(PathBuf, PathBuf)>,
    /// `certs.d`: per-registry hosts (None: containerd's defaults).
    pub registry_config_path: Option<PathBuf>,
}

pub struct ContainerdConfig {
    /// None: containerd's default paths (a machine of its own).
    pub paths: Option<StatePaths>,
    /// None: the CRI plugin is off.
    pub cri: Option<Cri>,
}

/// Plugins that cannot work on this machine kind or would probe it.
pub(crate) const DISABLED: &[&str] = &[
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
];

impl ContainerdConfig {
    /// The configuration file's text.
    pub fn to_toml(&self) -> String {
        let mut disabled: Vec<&str> = DISABLED.to_vec();
        if self.cri.is_none() {
            disabled.insert(0, "io.containerd.grpc.v1.cri");
        }
        let mut toml = self.head(2, &disabled);
        if let Some(cri) = &self.cri {
            toml.push_str(&cri.to_toml());
        }
        toml
    }
}

impl ContainerdConfig {
    /// What both versions share: the version, the state paths, the plugins
    /// turned off, no debug or metrics socket, the sockets' addresses.
    fn head(&self, version: u8, disabled: &[&str]) -> String {
        let mut toml = format!("version = {version}\n");
        if let Some(paths) = &self.paths {
            let _ = writeln!(toml, "root = {:?}", paths.root.display().to_string());
            let _ = writeln!(toml, "state = {:?}", paths.state.display().to_string());
        }
        toml.push_str("disabled_plugins = [\n");
        for plugin in disabled {
            let _ = writeln!(toml, "  {plugin:?},");
        }
        toml.push_str(
            "]\n\n[debug]\n  address = \"\"\n  level = \"info\"\n\n[metrics]\n  address = \"\"\n",
        );
        if let Some(paths) = &self.paths {
            let socket = paths.socket.display().to_string();
            let _ = write!(
                toml,
                "\n[grpc]\n  address = {socket:?}\n\n[ttrpc]\n  address = {:?}\n\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = {:?}\n",
                format!("{socket}.ttrpc"),
                paths.opt.display().to_string()
            );
        }
        toml
    }
}

impl Cri {
    /// runc's binary and state folder lines, when not the defaults.
    fn runc_options(&self) -> String {
        self.runc
            .as_ref()
            .map(|(binary, root)| {
                format!(
                    "        BinaryName = {:?}\n        Root = {:?}\n",
                    binary.display().to_string(),
                    root.display().to_string()
                )
            })
            .unwrap_or_default()
    }

    fn to_toml(&self) -> String {
        let section = "plugins.\"io.containerd.grpc.v1.cri\"";
        let mut toml = format!(
            "
[{section}]
  sandbox_image = {:?}
  # This machine refuses a negative oom_score_adj, which sandboxes ask for
  # (-998): without this every sandbox fails in runc.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  # kubelet proxies exec, attach and port-forward to this, on loopback.
  stream_server_address = \"127.0.0.1\"
  stream_server_port = \"0\"
  disable_tcp_service = true
  enable_cdi = false

  [{section}.containerd]
    snapshotter = \"overlayfs\"
    default_runtime_name = \"runc\"

    [{section}.containerd.runtimes.runc]
      runtime_type = \"io.containerd.runc.v2\"

      [{section}.containerd.runtimes.runc.options]
        SystemdCgroup = false
",
            self.sandbox_image
        );
        toml.push_str(&self.runc_options());
        let _ = write!(
            toml,
            "
  [{section}.cni]
    bin_dir = {:?}
    conf_dir = {:?}
    max_conf_num = 1
",
            self.cni_bin_dir.display().to_string(),
            self.cni_conf_dir.display().to_string()
        );
        if let Some(path) = &self.registry_config_path {
            let _ = write!(
                toml,
                "
  [{section}.registry]
    config_path = {:?}
",
                path.display().to_string()
            );
        }
        toml
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cri() -> Cri {
        Cri {
            sandbox_image: "k8s.gcr.io/pause:3.2".into(),
            cni_bin_dir: "/opt/cni/bin".into(),
            cni_conf_dir: "/etc/cni/net.d".into(),
            runc: None,
            registry_config_path: Some("/etc/containerd/certs.d".into()),
        }
    }

    #[test]
    fn a_node_at_the_default_paths_with_cri() {
        let toml = ContainerdConfig {
            paths: None,
            cri: Some(cri()),
        }
        .to_toml();
        assert!(toml.starts_with("version = 2\n"));
        assert!(!toml.contains("root ="), "{toml}");
        assert!(!toml.contains("\"io.containerd.grpc.v1.cri\",\n"), "{toml}");
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(toml.contains("sandbox_image = \"k8s.gcr.io/pause:3.2\""));
        assert!(toml.contains("config_path = \"/etc/containerd/certs.d\""));
        assert!(!toml.contains("BinaryName"));
        assert_eq!(
            toml.matches("[plugins.\"io.containerd.grpc.v1.cri\"]")
                .count(),
            1
        );
    }

    #[test]
    fn private_paths_and_runc_without_cri() {
        let toml = ContainerdConfig {
            paths: Some(StatePaths {
                root: "/tmp/c/root".into(),
                state: "/tmp/c/state".into(),
                socket: "/tmp/c/containerd.sock".into(),
                opt: "/tmp/c/opt".into(),
            }),
            cri: None,
        }
        .to_toml();
        assert!(toml.contains("root = \"/tmp/c/root\"\nstate = \"/tmp/c/state\"\n"));
        assert!(toml.contains("address = \"/tmp/c/containerd.sock\""));
        assert!(toml.contains("address = \"/tmp/c/containerd.sock.ttrpc\""));
        assert!(toml.contains("\"io.containerd.grpc.v1.cri\",\n"));
        assert!(!toml.contains("sandbox_image"));
        let with_runc = Cri {
            runc: Some(("/usr/sbin/runc".into(), "/tmp/c/state/runc".into())),
            ..cri()
        }
        .to_toml();
        assert!(
            with_runc
                .contains("BinaryName = \"/usr/sbin/runc\"\n        Root = \"/tmp/c/state/runc\"")
        );
    }
}
