//! Install: release binaries into the CNI bin dir and the default conflist
//! into the CNI conf dir. Each is written atomically (temp file + rename),
//! so a runtime never sees a half-written binary or configuration.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::util::{self, heading};

pub const CONFLIST_FILE: &str = "10-flatnet.conflist";
/// The binaries the plugin crate builds, installed when present.
pub const BINARIES: &[&str] = util::STATIC_BINARIES;
/// The Debian reference plugins (host-local, portmap, ...) live here.
pub use flatnet_harness::REFERENCE_PLUGINS;

#[derive(clap::Args, Clone)]
pub struct InstallArgs {
    /// Where runtimes look for CNI plugin binaries.
    #[arg(long, default_value = "/opt/cni/bin")]
    pub bin_dir: PathBuf,
    /// Where runtimes look for CNI network configurations.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub conf_dir: PathBuf,
}

/// The default network: flatnet with its tc datapath and flatnet-ipam on
/// 10.42.0.0/24.
pub fn default_conflist() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        // A 1.1.0 runtime picks 1.1.0 (and may send STATUS and GC); older ones 1.0.0.
        "cniVersions": ["1.0.0", "1.1.0"],
        "name": "flatnet",
        "plugins": [{
            "type": "flatnet",
            // What flatnet reads from runtimeConfig; a runtime passes only declared ones.
            "capabilities": {"mtu": true, "mac": true, "ips": true, "bandwidth": true},
            "bridge": "flatnet0",
            "mtu": 1500,
            "datapath": "tc",
            "ipam": {
                "type": "flatnet-ipam",
                "ranges": [[{"subnet": "10.42.0.0/24", "gateway": "10.42.0.1"}]],
                "dataDir": "/var/lib/cni/flatnet-ipam"
            }
        }]
    })
}

fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().context("no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let temp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    let mut file =
        std::fs::File::create(&temp).with_context(|| format!("creating {}", temp.display()))?;
    file.write_all(contents)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.sync_all()?;
    std::fs::rename(&temp, path)
        .with_context(|| format!("renaming {} to {}", temp.display(), path.display()))
}

pub fn install(args: &InstallArgs) -> anyhow::Result<()> {
    util::build(true, BINARIES)?;
    heading(&format!(
        "install into {} and {}",
        args.bin_dir.display(),
        args.conf_dir.display()
    ));
    for name in BINARIES {
        let built = util::binary(true, name)?;
        let bytes =
            std::fs::read(&built).with_context(|| format!("reading {}", built.display()))?;
        let dest = args.bin_dir.join(name);
        write_atomically(&dest, &bytes, 0o755)?;
        println!("installed {}", dest.display());
    }
    let conflist = args.conf_dir.join(CONFLIST_FILE);
    let text = serde_json::to_string_pretty(&default_conflist())? + "\n";
    write_atomically(&conflist, text.as_bytes(), 0o644)?;
    println!("wrote {}", conflist.display());
    Ok(())
}
