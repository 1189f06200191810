//! Writing a sysctl.

use super::*;

/// Writes a sysctl under /proc/sys (of the current thread's namespace).
pub fn set_sysctl(key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{key}");
    std::fs::write(&path, value).map_err(|e| Error::io(format!("writing {value} to {path}"), e))
}
