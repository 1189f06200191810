//! One image as it is written ([`ImageSpec`]): its names, its file system and
//! how it starts, and the image config made from them.

use serde_json::{Value, json};

use super::PATH_ENV;
use super::rootfs::Rootfs;

// --- Images -------------------------------------------------------------------

/// One image: its names, its file system (one layer) and how it starts.
#[derive(Clone, Debug)]
pub struct ImageSpec {
    /// Every name it is imported under (`RepoTags`), fully qualified as
    /// containerd's CRI looks them up (`docker.io/library/busybox:1.29`).
    pub names: Vec<String>,
    pub rootfs: Rootfs,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    /// The image's `User` (`uid`, `name`, `uid:gid`, ...); empty: root,
    /// and the config says nothing (so images without one keep their IDs).
    pub user: String,
}

impl ImageSpec {
    /// `names` on `rootfs`, with PATH set, started in `/`.
    pub fn new(names: &[&str], rootfs: Rootfs) -> Self {
        ImageSpec {
            names: names.iter().map(|name| name.to_string()).collect(),
            rootfs,
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec![PATH_ENV.to_string()],
            working_dir: "/".to_string(),
            user: String::new(),
        }
    }

    pub(super) fn entrypoint(mut self, args: &[&str]) -> Self {
        self.entrypoint = args.iter().map(|a| a.to_string()).collect();
        self
    }

    pub(super) fn cmd(mut self, args: &[&str]) -> Self {
        self.cmd = args.iter().map(|a| a.to_string()).collect();
        self
    }

    pub(super) fn user(mut self, user: &str) -> Self {
        self.user = user.to_string();
        self
    }

    /// The image config (what `docker inspect` calls Config), with the
    /// layer's diff ID.
    pub(super) fn config(&self, diff_id: &str) -> Value {
        // null, not [], when unset: an empty Entrypoint is not "none".
        let args = |args: &[String]| {
            if args.is_empty() {
                Value::Null
            } else {
                json!(args)
            }
        };
        let mut config = json!({
            "architecture": architecture(),
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Entrypoint": args(&self.entrypoint),
                "Cmd": args(&self.cmd),
                "Env": self.env,
                "WorkingDir": self.working_dir,
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{
                "created": "1970-01-01T00:00:00Z",
                "created_by": "cargo xtask e2e (xtask/src/e2e/images.rs)",
            }],
        });
        if !self.user.is_empty() {
            config["config"]["User"] = json!(self.user);
        }
        config
    }
}

/// The GOARCH name of this machine's architecture, as image configs say it.
pub(super) fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
