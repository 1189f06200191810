//! Every name the suites of other releases give the test images: the tags
//! change with every release (agnhost is 2.59 in 1.35, 2.63.0 in 1.36,
//! 2.66.1 in 1.37), and a pod whose image is not on the node cannot start:
//! nothing can be pulled here. Each image is given, beside the names it is
//! built with (1.37's), every name of its repository that the release's own
//! suite lists (`e2e.test --list-images`), so the images of one build serve
//! the suite of any release that `cargo xtask e2e --kubernetes` builds.

use std::process::Command;

use anyhow::Context;

use super::spec::ImageSpec;
use crate::e2e::build::Built;

/// Every image name the release's e2e suite may ask for.
pub fn listed(kube: &Built) -> anyhow::Result<Vec<String>> {
    let e2e = kube.bin("e2e.test");
    let out = Command::new(&e2e)
        .arg("--list-images")
        .output()
        .with_context(|| format!("running {} --list-images", e2e.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} --list-images failed ({}): {}",
        e2e.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect())
}

/// `spec` named also by every name in `listed` of a repository it has a
/// name in (`registry.k8s.io/e2e-test-images/agnhost:2.59` for agnhost).
pub fn add_release_names(spec: &mut ImageSpec, listed: &[String]) {
    let repositories: Vec<String> = spec
        .names
        .iter()
        .map(|name| repository(name).to_string())
        .collect();
    for name in listed {
        if repositories.iter().any(|r| r == repository(name)) && !spec.names.contains(name) {
            spec.names.push(name.clone());
        }
    }
}

/// A name without its tag (the last `:` after the last `/`: a registry's
/// port stays).
fn repository(name: &str) -> &str {
    let last_part = name.rfind('/').map_or(0, |slash| slash + 1);
    match name[last_part..].rfind(':') {
        Some(colon) => &name[..last_part + colon],
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2e::images::rootfs::Rootfs;

    #[test]
    fn an_image_gets_the_tags_of_its_repository_that_the_release_lists() {
        // What 1.35.4's `e2e.test --list-images` prints, in part.
        let listed: Vec<String> = [
            "registry.k8s.io/e2e-test-images/agnhost:2.55",
            "registry.k8s.io/e2e-test-images/agnhost:2.59",
            "gcr.io/k8s-authenticated-test/agnhost:2.6",
            "registry.k8s.io/e2e-test-images/nginx:1.14-4",
            "registry.k8s.io/pause:3.10.1",
        ]
        .map(String::from)
        .to_vec();
        let mut agnhost = ImageSpec::new(
            &[
                "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
                "registry.k8s.io/e2e-test-images/agnhost:2.55",
            ],
            Rootfs::new(),
        );
        add_release_names(&mut agnhost, &listed);
        assert_eq!(
            agnhost.names,
            [
                "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
                "registry.k8s.io/e2e-test-images/agnhost:2.55",
                "registry.k8s.io/e2e-test-images/agnhost:2.59",
            ],
            "the private registry's agnhost is another repository (its spec needs a pull secret)"
        );
        let mut pause = ImageSpec::new(&["registry.k8s.io/pause:3.10.2"], Rootfs::new());
        add_release_names(&mut pause, &listed);
        assert_eq!(
            pause.names,
            [
                "registry.k8s.io/pause:3.10.2",
                "registry.k8s.io/pause:3.10.1"
            ]
        );
    }

    #[test]
    fn a_registry_port_is_part_of_the_repository() {
        assert_eq!(
            repository("127.0.0.1:5000/pause:3.9"),
            "127.0.0.1:5000/pause"
        );
        assert_eq!(repository("127.0.0.1:5000/pause"), "127.0.0.1:5000/pause");
        assert_eq!(repository("busybox:1.29"), "busybox");
    }
}
