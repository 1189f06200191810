//! Kubernetes from its Go module: `k8s.io/kubernetes` is not meant to be
//! imported (its go.mod requires its staging modules at v0.0.0 and
//! replaces them with `./staging/...` folders a dependent never sees), so
//! our module requires it and replaces each staging module with its
//! published `v0.<minor>.<patch>`, then builds the servers, kubectl, the
//! e2e suite (`go test -c`), ginkgo at the version the suite requires, and
//! the suite's test image binaries.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::Release;
use super::go_module::{self, GoModule};

/// The commands built into `bin/`, by package.
const COMMANDS: &[&str] = &[
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes/cmd/kube-scheduler",
    "k8s.io/kubernetes/cmd/kubelet",
    "k8s.io/kubernetes/cmd/kube-proxy",
    "k8s.io/kubernetes/cmd/kubectl",
    "k8s.io/kubernetes/test/images/agnhost",
    "k8s.io/kubernetes/test/images/regression-issue-74839",
    // The runner the suite's own go.mod pins (MVS takes k8s's version).
    "github.com/onsi/ginkgo/v2/ginkgo",
];

/// The packages whose version variables the tree's build sets
/// (hack/lib/version.sh).
const VERSION_PACKAGES: &[&str] = &[
    "k8s.io/client-go/pkg/version",
    "k8s.io/component-base/version",
];

/// Downloads `k8s.io/kubernetes` at the release (its source folder is
/// returned: the suite's fixtures, agnhost's TLS pair), then builds it.
pub(super) fn kubernetes(release: &Release, root: &Path, bin: &Path) -> anyhow::Result<PathBuf> {
    let modules = root.join("modules");
    let (source, commit) = go_module::download(&modules, "k8s.io/kubernetes", &release.tag())?;
    let upstream_go_mod = std::fs::read_to_string(source.join("go.mod"))
        .with_context(|| format!("cannot read {}", source.join("go.mod").display()))?;
    let staging = go_module::local_replacements(&upstream_go_mod);
    anyhow::ensure!(
        !staging.is_empty(),
        "k8s.io/kubernetes {} replaces no staging module: its go.mod has changed shape",
        release.tag()
    );
    let module = GoModule {
        name: "kubernetes",
        requires: vec![("k8s.io/kubernetes".to_string(), release.tag())],
        replaces: staging
            .into_iter()
            .map(|path| (path, release.staging_tag()))
            .collect(),
        commands: COMMANDS
            .iter()
            .map(|package| {
                let name = package.rsplit('/').next().unwrap_or(package);
                (package.to_string(), name.to_string())
            })
            .collect(),
        test_binaries: vec![(
            "k8s.io/kubernetes/test/e2e".to_string(),
            "e2e.test".to_string(),
        )],
        ldflags: version_ldflags(release, &commit),
        tags: Vec::new(),
        sources: Vec::new(),
    };
    go_module::build(&module, root, bin)?;
    Ok(source)
}

/// What `hack/lib/version.sh` passes: the binaries then report the release
/// (kubelet's node status, `kubectl version`, the e2e suite's checks).
fn version_ldflags(release: &Release, commit: &str) -> Vec<String> {
    let mut values = vec![
        ("gitVersion", release.tag()),
        ("gitMajor", release.major.to_string()),
        ("gitMinor", release.minor.to_string()),
        ("gitTreeState", "clean".to_string()),
        ("buildDate", "1970-01-01T00:00:00Z".to_string()),
    ];
    if !commit.is_empty() {
        values.push(("gitCommit", commit.to_string()));
    }
    VERSION_PACKAGES
        .iter()
        .flat_map(|package| {
            values
                .iter()
                .map(move |(key, value)| format!("-X {package}.{key}={value}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binaries_report_the_release() {
        let release: Release = "1.37.2".parse().unwrap();
        let flags = version_ldflags(&release, "");
        assert!(flags.contains(&"-X k8s.io/component-base/version.gitVersion=v1.37.2".to_string()));
        assert!(flags.contains(&"-X k8s.io/client-go/pkg/version.gitMinor=37".to_string()));
        assert!(!flags.iter().any(|f| f.contains("gitCommit")));
    }
}
