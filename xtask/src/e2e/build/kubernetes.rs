//! The Kubernetes build: the tree's own make with Debian's Go 1.19, and the
//! binaries it makes copied into the cache's `bin/`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use super::{KUBE_BINARIES, Layout};
use crate::util::{heading, run_cmd};

const GO_BIN: &str = "/usr/lib/go-1.19/bin";

/// What `hack/lib/version.sh` would read from git; the commit is v1.20.2's
/// (the same one the tarball's `git archive` substitution carries).
const VERSION_FILE: &str = "KUBE_GIT_VERSION='v1.20.2'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
KUBE_GIT_COMMIT='faecb196815e248d3ecfb03c680a4507229c2a56'
KUBE_GIT_TREE_STATE='clean'
";

/// The three `make WHAT=...` runs, in order: servers and kubectl, the e2e
/// suite with its runner, the suite's test image binary.
const MAKE_TARGETS: &[&str] = &[
    "cmd/kube-apiserver cmd/kubelet cmd/kube-proxy cmd/kube-controller-manager cmd/kube-scheduler cmd/kubectl",
    "test/e2e/e2e.test vendor/github.com/onsi/ginkgo/ginkgo",
    "test/images/agnhost test/images/regression-issue-74839",
];

// --- The build ------------------------------------------------------------------

/// Runs the tree's own make with Debian's Go 1.19, then copies the binaries
/// into `bin/`. Each make is incremental (make's stamps, Go's cache), so
/// re-running after a failure only redoes what is missing.
pub(super) fn kubernetes(layout: &Layout) -> anyhow::Result<()> {
    let go = Path::new(GO_BIN).join("go");
    if !go.exists() {
        bail!("{} is missing: install golang-1.19-go", go.display());
    }
    // A GOPATH whose k8s.io/kubernetes is the tree, and make runs there:
    // Go tools misbehave outside a GOPATH (the tree's scripts then build in
    // their own one under _output/local/go, linked the same way).
    let link = layout.gopath.join("src/k8s.io/kubernetes");
    if fs::read_link(&link).ok().as_deref() != Some(layout.src.as_path()) {
        let parent = link.parent().context("the GOPATH link has no parent")?;
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&layout.src, &link).with_context(|| {
            format!("cannot link {} to {}", link.display(), layout.src.display())
        })?;
    }
    let version_file = layout.root.join("version.env");
    fs::write(&version_file, VERSION_FILE)
        .with_context(|| format!("cannot write {}", version_file.display()))?;
    fs::create_dir_all(&layout.gocache)
        .with_context(|| format!("cannot create {}", layout.gocache.display()))?;

    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(
        std::iter::once(PathBuf::from(GO_BIN)).chain(std::env::split_paths(&path)),
    )
    .context("PATH cannot hold the Go 1.19 folder")?;
    for what in MAKE_TARGETS {
        heading(&format!("make WHAT=\"{what}\""));
        let started = Instant::now();
        let mut cmd = Command::new("make");
        cmd.current_dir(&link)
            .arg(format!("WHAT={what}"))
            .env("PATH", &path)
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .env("GOPATH", &layout.gopath)
            .env("GOCACHE", &layout.gocache)
            // The tree builds in GOPATH mode with its vendor/ (its scripts
            // set GO111MODULE=off), so no -mod flag; and Go must never try
            // the network for a missing module.
            .env_remove("GOFLAGS")
            .env("GOPROXY", "off")
            .env("GOSUMDB", "off")
            .env("KUBE_GIT_VERSION_FILE", &version_file);
        run_cmd(&mut cmd).with_context(|| {
            format!(
                "building {what} failed: see the output above; a re-run resumes (delete {} to start over)",
                layout.root.display()
            )
        })?;
        println!("e2e-build: {what}: {:.0?}", started.elapsed());
    }

    // Go's own output: the copy into _output/local/bin is a convenience of
    // the tree's scripts (it needs rsync), this is where `go` wrote them.
    let out = layout.src.join("_output/local/go/bin");
    fs::create_dir_all(&layout.bin)
        .with_context(|| format!("cannot create {}", layout.bin.display()))?;
    for name in KUBE_BINARIES {
        let from = out.join(name);
        let to = layout.bin.join(name);
        let partial = layout.bin.join(format!(".{name}.partial"));
        fs::copy(&from, &partial)
            .with_context(|| format!("cannot copy {} (did the build make it?)", from.display()))?;
        fs::rename(&partial, &to).with_context(|| format!("cannot write {}", to.display()))?;
    }
    Ok(())
}
