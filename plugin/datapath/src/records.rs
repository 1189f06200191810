//! Per-attachment records: one JSON file per host veth in a folder of
//! their own (under /run/flatnet, tmpfs), written whole (a hidden temp file
//! renamed over, so no reader sees half of one) and read back together.

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Writes `record` as `dir/name`.
pub fn write<T: Serialize>(dir: &Path, name: &str, record: &T) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let path = dir.join(name);
    let temp = dir.join(format!(".{name}.tmp"));
    let bytes = serde_json::to_vec(record)
        .map_err(|e| Error::io(format!("encoding {}", path.display()), e.into()))?;
    std::fs::File::create(&temp)
        .and_then(|mut file| file.write_all(&bytes))
        .and_then(|()| std::fs::rename(&temp, &path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            Error::io(format!("writing {}", path.display()), e)
        })
}

/// Every record in `dir`, with its name; unreadable ones (a crash mid-write
/// leaves only a hidden temp file) skipped.
pub fn read_all<T: DeserializeOwned>(dir: &Path) -> Vec<(String, T)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            if name.starts_with('.') {
                return None;
            }
            let record = serde_json::from_slice(&std::fs::read(entry.path()).ok()?).ok()?;
            Some((name, record))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written_and_half_written_ones_are_skipped() {
        let dir = std::env::temp_dir().join(format!("flatnet-records-{}", std::process::id()));
        write(&dir, "veth-a", &vec![1u16, 2]).unwrap();
        write(&dir, "veth-b", &vec![3u16]).unwrap();
        std::fs::write(dir.join(".veth-c.tmp"), b"[4").unwrap();
        std::fs::write(dir.join("veth-d"), b"not json").unwrap();
        let mut read: Vec<(String, Vec<u16>)> = read_all(&dir);
        read.sort();
        assert_eq!(
            read,
            [
                ("veth-a".to_string(), vec![1, 2]),
                ("veth-b".to_string(), vec![3])
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
