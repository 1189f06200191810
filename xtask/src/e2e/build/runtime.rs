//! What runs beside Kubernetes, each from its Go module: etcd (the server
//! module is itself a `main`; the root module is not served at 3.7),
//! containerd 2 with its runc shim and `ctr`, and the CNI reference plugins
//! flatnet's conflist chains (Debian bookworm's 1.1.1 stop at CNI 1.0.0: at
//! 1.1.0 containerd 2 asks each plugin for STATUS, which they fail). And,
//! for `cargo xtask critest` only, cri-tools (`crictl`, and `critest`, the
//! CRI validation suite, a test binary upstream builds with `go test -c`):
//! the clusters never run them, so a cold suite does not build them.

use std::path::Path;

use super::go_module::{self, GoModule};

pub const ETCD_VERSION: &str = "v3.7.3";
pub const CONTAINERD_VERSION: &str = "v2.4.2";
pub const CRI_TOOLS_VERSION: &str = "v1.37.0";
pub const CNI_PLUGINS_VERSION: &str = "v1.10.0";

/// The reference plugins built, by their folder in the module.
const CNI_PLUGINS: &[(&str, &str)] = &[
    ("meta", "portmap"),
    ("meta", "bandwidth"),
    ("meta", "tuning"),
    ("main", "loopback"),
    ("ipam", "host-local"),
];

/// Where the reference plugins go, under `bin/`.
pub const CNI_PLUGINS_DIR: &str = "cni";

/// The binaries [`build`] makes in `bin/`.
pub const BINARIES: &[&str] = &[
    "etcd",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "cni/portmap",
    "cni/bandwidth",
    "cni/tuning",
    "cni/loopback",
    "cni/host-local",
];

fn etcd() -> GoModule {
    let server = "go.etcd.io/etcd/server/v3";
    GoModule {
        name: "etcd",
        requires: vec![(server.to_string(), ETCD_VERSION.to_string())],
        replaces: Vec::new(),
        commands: vec![(server.to_string(), "etcd".to_string())],
        test_binaries: Vec::new(),
        ldflags: vec![format!(
            "-X go.etcd.io/etcd/api/v3/version.GitSHA={ETCD_VERSION}"
        )],
        tags: Vec::new(),
        sources: Vec::new(),
    }
}

fn containerd() -> GoModule {
    let module = "github.com/containerd/containerd/v2";
    GoModule {
        name: "containerd",
        requires: vec![(module.to_string(), CONTAINERD_VERSION.to_string())],
        replaces: Vec::new(),
        commands: ["containerd", "containerd-shim-runc-v2", "ctr"]
            .iter()
            .map(|name| (format!("{module}/cmd/{name}"), name.to_string()))
            .collect(),
        test_binaries: Vec::new(),
        ldflags: vec![
            format!("-X {module}/version.Version={CONTAINERD_VERSION}"),
            format!("-X {module}/version.Package={module}"),
        ],
        // As upstream's Makefile, less the snapshotters that need cgo or
        // devices this machine lacks.
        tags: vec!["urfave_cli_no_docs", "no_btrfs", "no_devmapper", "no_zfs"],
        sources: Vec::new(),
    }
}

/// critest's package holds only a test file: tidy keeps its test-only
/// dependencies when a file of ours imports them.
const CRI_TOOLS_IMPORTS: &str = "//go:build tools

// Written by cargo xtask e2e-build: critest is `go test -c` of
// cmd/critest; these imports keep its dependencies in go.mod.
package tools

import (
\t_ \"github.com/onsi/ginkgo/v2\"
\t_ \"github.com/onsi/gomega\"
\t_ \"sigs.k8s.io/cri-tools/pkg/framework\"
\t_ \"sigs.k8s.io/cri-tools/pkg/validate\"
)
";

fn cri_tools() -> GoModule {
    let module = "sigs.k8s.io/cri-tools";
    GoModule {
        name: "cri-tools",
        requires: vec![(module.to_string(), CRI_TOOLS_VERSION.to_string())],
        replaces: Vec::new(),
        commands: vec![(format!("{module}/cmd/crictl"), "crictl".to_string())],
        test_binaries: vec![(format!("{module}/cmd/critest"), "critest".to_string())],
        ldflags: vec![format!(
            "-X {module}/pkg/version.Version={}",
            CRI_TOOLS_VERSION.trim_start_matches('v')
        )],
        tags: Vec::new(),
        sources: vec![("tools.go".to_string(), CRI_TOOLS_IMPORTS.to_string())],
    }
}

fn cni_plugins() -> GoModule {
    let module = "github.com/containernetworking/plugins";
    GoModule {
        name: "cni-plugins",
        requires: vec![(module.to_string(), CNI_PLUGINS_VERSION.to_string())],
        replaces: Vec::new(),
        commands: CNI_PLUGINS
            .iter()
            .map(|(kind, name)| {
                (
                    format!("{module}/plugins/{kind}/{name}"),
                    format!("{CNI_PLUGINS_DIR}/{name}"),
                )
            })
            .collect(),
        test_binaries: Vec::new(),
        ldflags: vec![format!(
            "-X {module}/pkg/utils/buildversion.BuildVersion={CNI_PLUGINS_VERSION}"
        )],
        tags: Vec::new(),
        sources: Vec::new(),
    }
}

/// Builds etcd, containerd and the CNI reference plugins into `bin`.
pub(super) fn build(root: &Path, bin: &Path) -> anyhow::Result<()> {
    for module in [etcd(), containerd(), cni_plugins()] {
        go_module::build(&module, root, bin)?;
    }
    Ok(())
}

/// Builds `crictl` and `critest` into `bin` (a second run finds them built).
pub(super) fn build_cri_tools(root: &Path, bin: &Path) -> anyhow::Result<()> {
    go_module::build(&cri_tools(), root, bin)
}
