//! The on-disk [`AllocationStore`]: one directory per network.
//!
//! Layout of `<dataDir>/<network>/`:
//! - `<address>`: the allocation record, JSON ([`Record`]). Its existence is
//!   the allocation: it is only ever created with `link()`, which refuses to
//!   replace an existing name, so an address can never be given twice and a
//!   record is never overwritten.
//! - `attachment.<key>.<set>.<address>`: a second name (hard link) of the same
//!   record, `<key>` a hash of (container ID, ifname). It lets ADD, DEL and
//!   CHECK find an attachment's records from the directory listing alone,
//!   without reading every record.
//! - `last_reserved.<set>`: where the walk of range set `<set>` continues, a
//!   symlink whose target is the address (metadata only, replaced atomically).
//! - `lock`: every process holds an exclusive `flock` on it while it reads or
//!   changes the directory, so the listing it acts on is the truth.
//!
//! Crash safety. A record is written completely under its attachment name
//! first and only then linked to its address name, so a process killed at
//! any point leaves either a whole record or an attachment file whose
//! address name does not exist; the next process under the lock sees the
//! latter as stale and removes it. DEL unlinks the address name first, so
//! a kill in between leaves the same kind of stale file. Pointers are
//! replaced with rename(2) from a temp name; temp files present while the
//! lock is held are leftovers of killed processes and are removed.
//!
//! Durability. By default (`"fsync": true`) a verb returns only once its
//! records and the directory are flushed, so an allocation a runtime was told
//! about survives a power loss. The flushes run after the lock is released:
//! the allocation is already visible to every other process (no duplicates),
//! and concurrent ADDs share their journal commits instead of queueing one
//! flush each behind the lock. A power loss before the flush can leave a
//! record empty; it is reported and its address stays out of use, never
//! handed out twice. Releases and the walk pointer are not flushed: losing
//! one to a power loss only keeps an address reserved until GC. `"fsync":
//! false` skips the flushes altogether (page cache only).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use flatnet_cni::error::{Error, Result};

mod allocation;

use super::Record;

const LOCK: &str = "lock";
const ATTACHMENT: &str = "attachment.";
const LAST_RESERVED: &str = "last_reserved.";
const TEMP: &str = ".tmp-";

/// The attachment key: a fixed-length file-name-safe hash, since container
/// IDs may be longer than a file name can be.
pub fn attachment_key(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::new()
        .chain_update(container_id.as_bytes())
        .chain_update([0u8])
        .chain_update(ifname.as_bytes())
        .finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A parsed `attachment.<key>.<set>.<address>` name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AttachmentName {
    name: String,
    key: String,
    range_set: usize,
    address: IpAddr,
}

impl AttachmentName {
    fn new(key: &str, range_set: usize, address: IpAddr) -> Self {
        AttachmentName {
            name: format!("{ATTACHMENT}{key}.{range_set}.{address}"),
            key: key.to_string(),
            range_set,
            address,
        }
    }

    fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix(ATTACHMENT)?;
        let (key, rest) = rest.split_once('.')?;
        let (set, address) = rest.split_once('.')?;
        let parsed = AttachmentName::new(key, set.parse().ok()?, address.parse().ok()?);
        // Only names we would have written ourselves.
        (parsed.name == name && key.len() == 32).then_some(parsed)
    }
}

/// The on-disk store of one network, locked for as long as it lives.
pub struct DiskStore {
    dir: PathBuf,
    fsync: bool,
    /// Held exclusively until the commit's flushes (or drop).
    lock: Option<File>,
    /// Records written since the last commit, to flush then.
    unsynced: Vec<File>,
    /// Every address that has a file at its name.
    addresses: HashSet<IpAddr>,
    attachments: Vec<AttachmentName>,
    /// The directory changed since the last commit.
    dirty: bool,
}

fn warn(dir: &Path, msg: impl std::fmt::Display) {
    eprintln!("flatnet-ipam: {}: {msg}", dir.display());
}

fn store_err(what: impl std::fmt::Display, path: &Path, e: std::io::Error) -> Error {
    Error::Store(format!("{what} {}: {e}", path.display()))
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

impl DiskStore {
    /// Opens (creating it when needed) and exclusively locks `dir`, then
    /// reads its listing and removes what killed processes left behind.
    pub fn open(dir: &Path, fsync: bool) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| store_err("creating", dir, e))?;
        let lock_path = dir.join(LOCK);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| store_err("opening", &lock_path, e))?;
        lock.lock()
            .map_err(|e| store_err("locking", &lock_path, e))?;
        let mut store = DiskStore {
            dir: dir.to_path_buf(),
            fsync,
            lock: Some(lock),
            unsynced: Vec::new(),
            addresses: HashSet::new(),
            attachments: Vec::new(),
            dirty: false,
        };
        store.scan()?;
        Ok(store)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn scan(&mut self) -> Result<()> {
        let listing =
            std::fs::read_dir(&self.dir).map_err(|e| store_err("listing", &self.dir, e))?;
        let mut attachments = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| store_err("listing", &self.dir, e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                warn(
                    &self.dir,
                    format_args!("ignoring foreign file {:?}", entry.file_name()),
                );
                continue;
            };
            if let Ok(ip) = name.parse::<IpAddr>() {
                self.addresses.insert(ip);
            } else if let Some(attachment) = AttachmentName::parse(&name) {
                attachments.push(attachment);
            } else if name.starts_with(TEMP) {
                // Temp files only exist while their writer holds the lock, which we now hold.
                self.remove(&name)?;
                warn(
                    &self.dir,
                    format_args!("removed {name}, left by a killed process"),
                );
            } else if name != LOCK && !is_pointer_name(&name) {
                warn(
                    &self.dir,
                    format_args!("ignoring foreign file {name:?}: it is not a flatnet-ipam file"),
                );
            }
        }
        let mut named = HashSet::new();
        for attachment in attachments {
            if self.addresses.contains(&attachment.address) {
                named.insert(attachment.address);
                self.attachments.push(attachment);
            } else {
                // Written by an ADD killed before it linked the address, or
                // left by a DEL killed after it unlinked it: not a record.
                self.remove(&attachment.name)?;
                warn(
                    &self.dir,
                    format_args!("removed {}, left by a killed process", attachment.name),
                );
            }
        }
        for ip in &self.addresses {
            if !named.contains(ip) {
                warn(
                    &self.dir,
                    format_args!(
                        "{ip} is not a flatnet-ipam record (no attachment file names it): the address stays out of use and the file is left alone; remove it if nothing uses {ip}"
                    ),
                );
            }
        }
        Ok(())
    }

    /// The attachment names (container ID, ifname) holds, from the listing.
    fn attachments_of(&self, container_id: &str, ifname: &str) -> Vec<AttachmentName> {
        let key = attachment_key(container_id, ifname);
        self.attachments
            .iter()
            .filter(|a| a.key == key)
            .cloned()
            .collect()
    }

    fn remove(&mut self, name: &str) -> Result<()> {
        let path = self.path(name);
        // Not flushed: a release lost to a power loss leaves the address
        // reserved (GC frees it), never handed out twice.
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(store_err("removing", &path, e))
            }
            _ => Ok(()),
        }
    }

    /// Whether the attachment file is a name of the record at its address;
    /// if not (the address was released and given to someone else since),
    /// it is stale and removed.
    fn is_live(&mut self, attachment: &AttachmentName) -> Result<bool> {
        let meta = |name: &str| -> Result<Option<std::fs::Metadata>> {
            let path = self.path(name);
            match std::fs::symlink_metadata(&path) {
                Ok(meta) => Ok(Some(meta)),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(store_err("reading", &path, e)),
            }
        };
        let ours = meta(&attachment.name)?;
        let record = meta(&attachment.address.to_string())?;
        match (ours, record) {
            (Some(a), Some(b)) if same_file(&a, &b) => Ok(true),
            (None, _) => Ok(false),
            (Some(_), _) => {
                self.remove(&attachment.name)?;
                self.attachments.retain(|a| a.name != attachment.name);
                Ok(false)
            }
        }
    }

    /// Releases one record of an attachment; false when it was not there.
    fn release_one(
        &mut self,
        attachment: &AttachmentName,
        container_id: &str,
        ifname: &str,
    ) -> Result<bool> {
        if !self.is_live(attachment)? {
            return Ok(false);
        }
        match self.read_record(&attachment.name) {
            Ok(record) if record.container_id != container_id || record.ifname != ifname => {
                warn(
                    &self.dir,
                    format_args!(
                        "{} names {container_id} ({ifname}) but holds {} ({}); left alone",
                        attachment.name, record.container_id, record.ifname
                    ),
                );
                return Ok(false);
            }
            Ok(_) => {}
            // Its name is the attachment's own hash: still the attachment's to free.
            Err(reason) => warn(
                &self.dir,
                format_args!("releasing unreadable record {}: {reason}", attachment.name),
            ),
        }
        // The address first: a kill in between leaves a stale attachment file, not a leak.
        self.remove(&attachment.address.to_string())?;
        self.addresses.remove(&attachment.address);
        self.remove(&attachment.name)?;
        self.attachments.retain(|a| a.name != attachment.name);
        Ok(true)
    }

    fn read_record(&self, name: &str) -> std::result::Result<Record, String> {
        let path = self.path(name);
        let mut text = Vec::with_capacity(256);
        File::open(&path)
            .and_then(|mut file| file.read_to_end(&mut text))
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&text).map_err(|e| format!("not a record ({e})"))
    }

    /// Points `name` at `target`: a symlink made under a temp name and
    /// renamed over the old one. A symlink this short lives in its inode, so
    /// replacing it writes no data block and triggers no writeback (a
    /// regular file renamed over another makes ext4 flush it at once).
    fn replace_link(&mut self, name: &str, target: &str) -> Result<()> {
        let temp = self.path(&format!("{TEMP}{name}"));
        std::os::unix::fs::symlink(target, &temp).map_err(|e| store_err("creating", &temp, e))?;
        let path = self.path(name);
        std::fs::rename(&temp, &path).map_err(|e| store_err("renaming onto", &path, e))?;
        // Only where the walk resumes: not worth a flush of its own.
        Ok(())
    }
}

fn is_pointer_name(name: &str) -> bool {
    name.strip_prefix(LAST_RESERVED)
        .is_some_and(|set| set.parse::<usize>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::AllocationStore;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "flatnet-ipam-store-{tag}-{}-{n}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn record(id: &str, ip: &str, set: usize) -> Record {
        Record {
            container_id: id.into(),
            ifname: "eth0".into(),
            address: ip.parse().unwrap(),
            range_set: set,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn reserve_find_and_release_round_trip_on_disk() {
        let tmp = TempDir::new("round");
        for fsync in [false, true] {
            let mut store = DiskStore::open(&tmp.0, fsync).unwrap();
            assert!(store.reserve(&record("a", "10.0.0.2", 0)).unwrap());
            assert!(store.reserve(&record("a", "fd00::2", 1)).unwrap());
            assert!(!store.reserve(&record("b", "10.0.0.2", 0)).unwrap());
            store
                .set_last_reserved(0, "10.0.0.2".parse().unwrap())
                .unwrap();
            store.commit().unwrap();
            drop(store);

            let mut store = DiskStore::open(&tmp.0, fsync).unwrap();
            assert!(store.is_taken("10.0.0.2".parse().unwrap()));
            assert_eq!(
                store.held_by("a", "eth0").unwrap(),
                vec![
                    (0, "10.0.0.2".parse().unwrap()),
                    (1, "fd00::2".parse().unwrap())
                ]
            );
            assert!(store.held_by("a", "eth1").unwrap().is_empty());
            assert_eq!(
                store
                    .owner("10.0.0.2".parse().unwrap())
                    .unwrap()
                    .container_id,
                "a"
            );
            assert_eq!(store.last_reserved(0), Some("10.0.0.2".parse().unwrap()));
            assert_eq!(store.last_reserved(1), None);
            assert_eq!(store.records().unwrap().len(), 2);
            let released = store.release("a", "eth0").unwrap();
            assert_eq!(released.len(), 2);
            assert!(store.release("a", "eth0").unwrap().is_empty());
            store.commit().unwrap();
            drop(store);
            assert_eq!(names(&tmp.0), vec!["last_reserved.0", "lock"]);
        }
    }

    #[test]
    fn the_record_is_json_under_both_names() {
        let tmp = TempDir::new("json");
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        store.reserve(&record("ctr-1", "10.0.0.9", 0)).unwrap();
        drop(store);
        let text = std::fs::read_to_string(tmp.0.join("10.0.0.9")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["containerID"], "ctr-1");
        assert_eq!(json["ifname"], "eth0");
        assert_eq!(json["address"], "10.0.0.9");
        assert_eq!(json["rangeSet"], 0);
        let key = attachment_key("ctr-1", "eth0");
        let alias = tmp.0.join(format!("attachment.{key}.0.10.0.0.9"));
        assert_eq!(std::fs::read_to_string(alias).unwrap(), text);
    }

    #[test]
    fn leftovers_of_killed_processes_are_cleaned_and_foreign_files_kept() {
        let tmp = TempDir::new("left");
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        store.reserve(&record("a", "10.0.0.2", 0)).unwrap();
        drop(store);
        let key = attachment_key("b", "eth0");
        // An ADD killed before link(), a DEL killed after unlinking the address,
        // a pointer write killed before rename(), and files that are not ours.
        std::fs::write(
            tmp.0.join(format!("attachment.{key}.0.10.0.0.3")),
            "{\"contai",
        )
        .unwrap();
        std::fs::write(tmp.0.join(".tmp-last_reserved.0"), "10.0").unwrap();
        std::fs::write(tmp.0.join("10.0.0.7"), "garbage").unwrap();
        std::fs::write(tmp.0.join("notes.txt"), "hello").unwrap();
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        assert!(
            store.is_taken("10.0.0.7".parse().unwrap()),
            "a foreign file keeps its address"
        );
        assert!(!store.is_taken("10.0.0.3".parse().unwrap()));
        assert!(store.owner("10.0.0.7".parse().unwrap()).is_none());
        assert_eq!(store.records().unwrap().len(), 1);
        drop(store);
        let left = names(&tmp.0);
        assert_eq!(left.len(), 5, "{left:?}");
        assert_eq!(
            std::fs::read_to_string(tmp.0.join("10.0.0.7")).unwrap(),
            "garbage"
        );
        assert!(left.contains(&"notes.txt".to_string()));
        assert!(
            !left
                .iter()
                .any(|n| n.starts_with(".tmp-") || n.ends_with("10.0.0.3"))
        );
    }

    #[test]
    fn a_stale_attachment_file_does_not_claim_a_reused_address() {
        let tmp = TempDir::new("stale");
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        store.reserve(&record("a", "10.0.0.2", 0)).unwrap();
        drop(store);
        // A DEL of "a" killed after unlinking the address, then "b" got it.
        let key = attachment_key("a", "eth0");
        let stale = tmp.0.join(format!("attachment.{key}.0.10.0.0.2"));
        std::fs::remove_file(tmp.0.join("10.0.0.2")).unwrap();
        let kept = std::fs::read(&stale).unwrap();
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        assert!(store.reserve(&record("b", "10.0.0.2", 0)).unwrap());
        drop(store);
        std::fs::write(&stale, kept).unwrap();
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        assert!(store.held_by("a", "eth0").unwrap().is_empty());
        assert!(!stale.exists(), "the stale file is removed");
        assert!(store.release("a", "eth0").unwrap().is_empty());
        assert_eq!(
            store
                .owner("10.0.0.2".parse().unwrap())
                .unwrap()
                .container_id,
            "b"
        );
    }

    #[test]
    fn a_torn_record_is_reported_kept_by_gc_but_released_by_its_own_del() {
        let tmp = TempDir::new("torn");
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        store.reserve(&record("a", "10.0.0.2", 0)).unwrap();
        drop(store);
        // Same inode, content gone (what a power loss may do without fsync).
        std::fs::write(tmp.0.join("10.0.0.2"), "").unwrap();
        let mut store = DiskStore::open(&tmp.0, false).unwrap();
        assert!(store.records().unwrap().is_empty());
        assert!(store.is_taken("10.0.0.2".parse().unwrap()));
        assert_eq!(store.held_by("a", "eth0").unwrap().len(), 1);
        assert_eq!(store.release("a", "eth0").unwrap().len(), 1);
    }

    #[test]
    fn attachment_names_parse_only_when_well_formed() {
        let key = attachment_key("c", "eth0");
        assert_eq!(key.len(), 32);
        let name = format!("attachment.{key}.1.fd00::5");
        let parsed = AttachmentName::parse(&name).unwrap();
        assert_eq!(parsed.range_set, 1);
        assert_eq!(parsed.address, "fd00::5".parse::<IpAddr>().unwrap());
        for bad in [
            "attachment.".to_string(),
            format!("attachment.{key}.x.10.0.0.1"),
            format!("attachment.{key}.0.10.0.0"),
            "attachment.abc.0.10.0.0.1".to_string(),
            format!("attachment.{key}.01.10.0.0.1"),
        ] {
            assert!(AttachmentName::parse(&bad).is_none(), "{bad}");
        }
        assert_ne!(attachment_key("c", "eth0"), attachment_key("c", "eth1"));
        assert_ne!(attachment_key("ab", "c"), attachment_key("a", "bc"));
    }

    #[test]
    fn concurrent_stores_serialize_on_the_lock() {
        let tmp = TempDir::new("lock");
        let dir = tmp.0.clone();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    for i in 0..10 {
                        let mut store = DiskStore::open(&dir, false).unwrap();
                        let id = format!("c{t}-{i}");
                        let mut n = 2;
                        while !store
                            .reserve(&record(&id, &format!("10.0.{}.{}", n / 250, n % 250), 0))
                            .unwrap()
                        {
                            n += 1;
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut store = DiskStore::open(&dir, false).unwrap();
        let records = store.records().unwrap();
        assert_eq!(records.len(), 80);
        let distinct: HashSet<IpAddr> = records.iter().map(|r| r.address).collect();
        assert_eq!(distinct.len(), 80);
    }
}
