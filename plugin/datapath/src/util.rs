//! Small helpers several modules need.

use std::io;
use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;

/// `cidr` with its host bits cleared (10.1.2.3/16 -> 10.1.0.0/16): the form
/// routes, nftables sets and the remote-CIDR tries hold.
pub fn normalized(cidr: IpNetwork) -> IpNetwork {
    IpNetwork::new(cidr.network(), cidr.prefix()).unwrap_or(cidr)
}

/// Removes the file at `path`; true when it was there, false when it was
/// already gone.
pub fn remove_file_if_present(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Where cgroup v2 is mounted (its root holds every process of the node;
/// the Service socket programs attach there). None without a cgroup2 mount.
pub fn cgroup2_root() -> io::Result<Option<PathBuf>> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    Ok(mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_clears_host_bits_of_both_families() {
        assert_eq!(
            normalized("10.1.2.3/16".parse().unwrap()),
            "10.1.0.0/16".parse::<IpNetwork>().unwrap()
        );
        assert_eq!(
            normalized("fd00::5/64".parse().unwrap()),
            "fd00::/64".parse::<IpNetwork>().unwrap()
        );
    }

    #[test]
    fn removing_a_missing_file_is_not_an_error() {
        let path = std::env::temp_dir().join(format!("flatnet-util-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        assert!(remove_file_if_present(&path).unwrap());
        assert!(!remove_file_if_present(&path).unwrap());
    }
}
