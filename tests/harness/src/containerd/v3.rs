//! containerd 2's configuration (`version = 3`): the CRI plugin is split
//! into `io.containerd.cri.v1.images` (the sandbox image, the snapshotter,
//! registries) and `io.containerd.cri.v1.runtime` (runc, CNI); the stream
//! server stays with `io.containerd.grpc.v1.cri`. What containerd 2 adds
//! that this machine must not use is off: NRI (its socket and plugin
//! folder are shared paths), CDI's spec folders, the erofs and blockfile
//! snapshotters.

use std::fmt::Write as _;
use std::path::Path;

use super::{ContainerdConfig, DISABLED};

/// containerd 2's own plugins that are off besides the 1.6 list.
const DISABLED_V2: &[&str] = &[
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.snapshotter.v1.erofs",
    "io.containerd.differ.v1.erofs",
    "io.containerd.mount-handler.v1.erofs",
    "io.containerd.internal.v1.tracing",
    "io.containerd.nri.v1.nri",
];

impl ContainerdConfig {
    /// The `version = 3` text; `shim` is the runc shim of the same build
    /// (containerd looks `containerd-shim-runc-v2` up on PATH otherwise,
    /// and may find another containerd's).
    pub fn to_toml_v3(&self, shim: &Path) -> String {
        let mut disabled: Vec<&str> = DISABLED
            .iter()
            // containerd 2 has no aufs snapshotter to turn off.
            .filter(|plugin| !plugin.ends_with(".aufs"))
            .chain(DISABLED_V2)
            .copied()
            .collect();
        if self.cri.is_none() {
            disabled.extend([
                "io.containerd.grpc.v1.cri",
                "io.containerd.cri.v1.images",
                "io.containerd.cri.v1.runtime",
            ]);
        }
        let mut toml = self.head(3, &disabled);
        let Some(cri) = &self.cri else {
            return toml;
        };
        let images = "plugins.\"io.containerd.cri.v1.images\"";
        let runtime = "plugins.\"io.containerd.cri.v1.runtime\"";
        let _ = write!(
            toml,
            "
[{images}]
  snapshotter = \"overlayfs\"

  [{images}.pinned_images]
    sandbox = {:?}
",
            cri.sandbox_image
        );
        if let Some(path) = &cri.registry_config_path {
            let _ = write!(
                toml,
                "\n  [{images}.registry]\n    config_path = {:?}\n",
                path.display().to_string()
            );
        }
        let _ = write!(
            toml,
            "
[{runtime}]
  # This machine refuses a negative oom_score_adj, which sandboxes ask for
  # (-998): without this every sandbox fails in runc.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  cdi_spec_dirs = []

  [{runtime}.containerd]
    default_runtime_name = \"runc\"

    [{runtime}.containerd.runtimes.runc]
      runtime_type = \"io.containerd.runc.v2\"
      runtime_path = {:?}

      [{runtime}.containerd.runtimes.runc.options]
        SystemdCgroup = false
",
            shim.display().to_string()
        );
        toml.push_str(&cri.runc_options());
        let _ = write!(
            toml,
            "
  [{runtime}.cni]
    bin_dirs = [{:?}]
    conf_dir = {:?}
    max_conf_num = 1

[plugins.\"io.containerd.grpc.v1.cri\"]
  # kubelet proxies exec, attach and port-forward to this, on loopback.
  stream_server_address = \"127.0.0.1\"
  stream_server_port = \"0\"
  disable_tcp_service = true
",
            cri.cni_bin_dir.display().to_string(),
            cri.cni_conf_dir.display().to_string()
        );
        toml
    }
}

#[cfg(test)]
mod tests {
    use super::super::Cri;
    use super::*;

    #[test]
    fn a_node_of_containerd_2() {
        let toml = ContainerdConfig {
            paths: None,
            cri: Some(Cri {
                sandbox_image: "registry.k8s.io/pause:3.10.2".into(),
                cni_bin_dir: "/opt/cni/bin".into(),
                cni_conf_dir: "/etc/cni/net.d".into(),
                runc: None,
                registry_config_path: Some("/etc/containerd/certs.d".into()),
            }),
        }
        .to_toml_v3(Path::new("/cache/bin/containerd-shim-runc-v2"));
        assert!(toml.starts_with("version = 3\n"));
        assert!(!toml.contains("aufs"), "{toml}");
        assert!(toml.contains("\"io.containerd.nri.v1.nri\",\n"), "{toml}");
        assert!(toml.contains("sandbox = \"registry.k8s.io/pause:3.10.2\""));
        assert!(toml.contains("config_path = \"/etc/containerd/certs.d\""));
        assert!(toml.contains("runtime_path = \"/cache/bin/containerd-shim-runc-v2\""));
        assert!(toml.contains("bin_dirs = [\"/opt/cni/bin\"]"));
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(!toml.contains("sandbox_image"), "the v2 key: {toml}");
        assert!(!toml.contains("BinaryName"));
    }
}
