//! A Go module of our own that names upstream modules at pinned versions
//! and builds their commands from the Go module proxy: written into the
//! cache (never committed: nothing fetched is), resolved with `go mod
//! tidy`, built with `go build` / `go test -c`. Go's own caches (modules
//! and builds) make a second build a matter of seconds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::util::{heading, output, run_cmd};

/// One module of ours: what it requires and replaces, and what it builds.
pub struct GoModule {
    /// Its folder (go.mod is written there) and module path's last part.
    pub name: &'static str,
    /// `module version` pairs it requires.
    pub requires: Vec<(String, String)>,
    /// `module => module version` replacements.
    pub replaces: Vec<(String, String)>,
    /// Main packages built into the bin folder, each with its binary's
    /// name (`go build -o bin/NAME PACKAGE`).
    pub commands: Vec<(String, String)>,
    /// Test packages compiled into a binary (`go test -c`), with its name.
    pub test_binaries: Vec<(String, String)>,
    /// `-X` linker settings (the version a binary reports).
    pub ldflags: Vec<String>,
    /// Build tags.
    pub tags: Vec<&'static str>,
    /// Source files of our own that the module holds (a `main` package
    /// where upstream's main is in a module that is not served): relative
    /// path and text.
    pub sources: Vec<(String, String)>,
}

/// The go.mod text of `module`: its requirements, replacements and, as
/// `tool` lines, the commands it builds (so `go mod tidy` keeps what they
/// import).
pub fn go_mod(module: &GoModule) -> String {
    let mut text = format!(
        "// Written by cargo xtask e2e-build: builds {} from the Go module proxy.\n\
         module flatnet.local/{}\n\ngo 1.26.0\n",
        module
            .commands
            .iter()
            .map(|(_, name)| name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        module.name
    );
    if !module.requires.is_empty() {
        text.push_str("\nrequire (\n");
        for (path, version) in &module.requires {
            let _ = writeln!(text, "\t{path} {version}");
        }
        text.push_str(")\n");
    }
    if !module.replaces.is_empty() {
        text.push_str("\nreplace (\n");
        for (path, version) in &module.replaces {
            let _ = writeln!(text, "\t{path} => {path} {version}");
        }
        text.push_str(")\n");
    }
    // Packages of our own are built by their path in this module: they are
    // no tools of another module.
    let own = format!("flatnet.local/{}", module.name);
    let tools: Vec<&String> = module
        .commands
        .iter()
        .map(|(package, _)| package)
        .filter(|package| !package.starts_with(&own))
        .collect();
    if !tools.is_empty() {
        text.push_str("\ntool (\n");
        for command in tools {
            let _ = writeln!(text, "\t{command}");
        }
        text.push_str(")\n");
    }
    text
}

/// The module paths a go.mod replaces with folders of its own tree
/// (`k8s.io/api => ./staging/src/k8s.io/api`): Kubernetes's staging
/// modules, which a module depending on it must replace with their
/// published versions.
pub fn local_replacements(go_mod: &str) -> Vec<String> {
    let mut in_block = false;
    let mut found = Vec::new();
    for line in go_mod.lines() {
        let line = line.trim();
        let entry = if in_block {
            if line == ")" {
                in_block = false;
                continue;
            }
            line
        } else if line == "replace (" {
            in_block = true;
            continue;
        } else if let Some(single) = line.strip_prefix("replace ") {
            single
        } else {
            continue;
        };
        if let Some((from, to)) = entry.split_once("=>")
            && to.trim().starts_with("./")
            && let Some(path) = from.split_whitespace().next()
        {
            found.push(path.to_string());
        }
    }
    found
}

/// `go` with the environment every build here uses: no cgo unless asked,
/// the proxy for modules, the machine's Go caches.
fn go(dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod -buildvcs=false");
    cmd
}

/// Where `go mod download` put `module@version`: (its folder, the commit
/// it was made from when the proxy says).
pub fn download(dir: &Path, module: &str, version: &str) -> anyhow::Result<(PathBuf, String)> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let said = output(
        go(dir)
            .args(["mod", "download", "-json"])
            .arg(format!("{module}@{version}")),
    )
    .with_context(|| {
        format!("cannot download {module}@{version} from the Go module proxy (is it served?)")
    })?;
    let info: serde_json::Value = serde_json::from_str(&said)
        .with_context(|| format!("go mod download printed no JSON: {said}"))?;
    let folder = info["Dir"]
        .as_str()
        .with_context(|| format!("go mod download named no folder: {said}"))?;
    let commit = info["Origin"]["Hash"].as_str().unwrap_or_default();
    Ok((PathBuf::from(folder), commit.to_string()))
}

/// Writes `module`'s go.mod (and its own sources) under `root`, resolves
/// it, and builds its commands and test binaries into `bin`.
pub fn build(module: &GoModule, root: &Path, bin: &Path) -> anyhow::Result<()> {
    let dir = root.join("modules").join(module.name);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::create_dir_all(bin).with_context(|| format!("cannot create {}", bin.display()))?;
    let text = go_mod(module);
    // What the last complete build of this module was made from: the same
    // again, with every output still there, is not built again.
    let recipe = format!(
        "{text}\nldflags: {}\ntags: {}\nsources: {:?}\n",
        module.ldflags.join(" "),
        module.tags.join(","),
        module.sources
    );
    let stamp = dir.join(".built");
    let outputs_there = module
        .commands
        .iter()
        .chain(&module.test_binaries)
        .all(|(_, name)| bin.join(name).exists());
    if outputs_there && fs::read_to_string(&stamp).ok().as_deref() == Some(recipe.as_str()) {
        println!("e2e-build: {} is built", module.name);
        return Ok(());
    }
    let _ = fs::remove_file(&stamp);
    let go_mod_path = dir.join("go.mod");
    // Written anew each time: tidy then resolves it from what it names.
    fs::write(&go_mod_path, &text)
        .with_context(|| format!("cannot write {}", go_mod_path.display()))?;
    for (path, source) in &module.sources {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&file, source).with_context(|| format!("cannot write {}", file.display()))?;
    }
    heading(&format!("go: {} ({})", module.name, dir.display()));
    let started = Instant::now();
    run_cmd(go(&dir).args(["mod", "tidy"])).with_context(|| {
        format!(
            "go mod tidy in {} failed: is the Go module proxy reachable?",
            dir.display()
        )
    })?;
    let flags = module.ldflags.join(" ");
    let tags = module.tags.join(",");
    // One `go build` per output folder: go then compiles and links the
    // commands side by side on every core, where one build per command
    // leaves a core idle through each link.
    for (output, packages) in command_batches(&module.commands, bin) {
        // A folder (`-o dir/`) is made as it is; a file's folder, above it.
        let folder = if output.as_os_str().to_string_lossy().ends_with('/') {
            output.as_path()
        } else {
            output.parent().unwrap_or(bin)
        };
        fs::create_dir_all(folder)
            .with_context(|| format!("cannot create {}", folder.display()))?;
        let mut cmd = go(&dir);
        cmd.args(["build", "-trimpath", NO_DWARF, "-tags", &tags, "-ldflags"])
            .arg(format!("-s -w {flags}"))
            .arg("-o")
            .arg(&output)
            .args(&packages);
        run_cmd(&mut cmd).with_context(|| format!("building {}", packages.join(" ")))?;
    }
    for (package, name) in &module.test_binaries {
        let mut cmd = go(&dir);
        cmd.args([
            "test",
            "-c",
            "-trimpath",
            NO_DWARF,
            "-tags",
            &tags,
            "-ldflags",
        ])
        .arg(format!("-s -w {flags}"))
        .arg("-o")
        .arg(bin.join(name))
        .arg(package);
        run_cmd(&mut cmd).with_context(|| format!("building {package}'s tests"))?;
    }
    println!(
        "e2e-build: {}: {:.0} s",
        module.name,
        started.elapsed().as_secs_f64()
    );
    for (_, name) in module.commands.iter().chain(&module.test_binaries) {
        if !bin.join(name).exists() {
            bail!("go did not make {}", bin.join(name).display());
        }
    }
    fs::write(&stamp, recipe).with_context(|| format!("cannot write {}", stamp.display()))?;
    Ok(())
}

/// The compiler makes no DWARF for any package: the linker's `-s -w`
/// strips it from every binary anyway, and making it cost compile time.
const NO_DWARF: &str = "-gcflags=all=-dwarf=false";

/// The commands by what `go build -o` is given: a folder (ending in `/`)
/// for those go names as `bin/` wants them (the package's last element,
/// the one before a `/vN`), the file for each other one.
fn command_batches(commands: &[(String, String)], bin: &Path) -> BTreeMap<PathBuf, Vec<String>> {
    let mut batches: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    for (package, name) in commands {
        let output = bin.join(name);
        let folder = output.parent().unwrap_or(bin);
        let target = if output.file_name().and_then(|n| n.to_str()) == Some(go_name(package)) {
            // The trailing slash makes go treat it as a folder.
            folder.join("")
        } else {
            output
        };
        batches.entry(target).or_default().push(package.clone());
    }
    batches
}

/// The name go gives a command's binary: its package's last element, or
/// the one before it when that is a major version (`server/v3`: server).
fn go_name(package: &str) -> &str {
    let mut elements = package.rsplit('/');
    let last = elements.next().unwrap_or(package);
    let is_version =
        last.len() > 1 && last.starts_with('v') && last[1..].chars().all(|c| c.is_ascii_digit());
    match elements.next() {
        Some(before) if is_version => before,
        _ => last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_go_names_as_wanted_are_built_together() {
        let bin = Path::new("/c/bin");
        let commands: Vec<(String, String)> = [
            ("k8s.io/kubernetes/cmd/kubelet", "kubelet"),
            ("github.com/onsi/ginkgo/v2/ginkgo", "ginkgo"),
            ("k8s.io/kubernetes/cmd/kubectl", "kubectl"),
            ("go.etcd.io/etcd/server/v3", "etcd"),
            ("example.com/plugins/meta/portmap", "cni/portmap"),
            ("example.com/plugins/main/loopback", "cni/loopback"),
        ]
        .iter()
        .map(|(p, n)| (p.to_string(), n.to_string()))
        .collect();
        let batches = command_batches(&commands, bin);
        let batch = |path: &str| batches[Path::new(path)].clone();
        assert_eq!(batches.len(), 3, "{batches:?}");
        assert_eq!(batch("/c/bin/").len(), 3);
        assert_eq!(batch("/c/bin/etcd"), ["go.etcd.io/etcd/server/v3"]);
        // go takes `-o` as a folder only with the trailing slash.
        let given: Vec<String> = batches.keys().map(|k| k.display().to_string()).collect();
        assert_eq!(given, ["/c/bin/", "/c/bin/cni/", "/c/bin/etcd"]);
        assert_eq!(batch("/c/bin/cni/").len(), 2);
        assert_eq!(go_name("go.etcd.io/etcd/server/v3"), "server");
        assert_eq!(go_name("github.com/onsi/ginkgo/v2/ginkgo"), "ginkgo");
        assert_eq!(go_name("example.com/v"), "v");
    }

    #[test]
    fn staging_modules_are_the_local_replacements() {
        let go_mod = "module k8s.io/kubernetes\n\nrequire (\n\tk8s.io/api v0.0.0\n)\n\n\
                      replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\
                      \tgithub.com/x/y v1.0.0 => github.com/x/z v1.0.1\n)\n\
                      replace k8s.io/kms => ./staging/src/k8s.io/kms\n";
        assert_eq!(local_replacements(go_mod), ["k8s.io/api", "k8s.io/kms"]);
    }

    #[test]
    fn go_mod_names_requirements_replacements_and_tools() {
        let module = GoModule {
            name: "kubernetes",
            requires: vec![("k8s.io/kubernetes".into(), "v1.37.2".into())],
            replaces: vec![("k8s.io/api".into(), "v0.37.2".into())],
            commands: vec![
                ("k8s.io/kubernetes/cmd/kubelet".into(), "kubelet".into()),
                ("flatnet.local/kubernetes/x".into(), "x".into()),
            ],
            test_binaries: Vec::new(),
            ldflags: Vec::new(),
            tags: Vec::new(),
            sources: Vec::new(),
        };
        let text = go_mod(&module);
        assert!(text.contains("module flatnet.local/kubernetes\n"));
        assert!(text.contains("\tk8s.io/kubernetes v1.37.2\n"));
        assert!(text.contains("\tk8s.io/api => k8s.io/api v0.37.2\n"));
        assert!(text.contains("tool (\n\tk8s.io/kubernetes/cmd/kubelet\n)"));
        assert!(!text.contains("tool (\n\tflatnet.local"));
    }
}
