//! The verbs' view of the disk store: [`AllocationStore`] over the
//! directory layout and locking of `DiskStore`.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;

use flatnet_cni::error::{Error, Result};

use super::{AttachmentName, DiskStore, LAST_RESERVED, attachment_key, store_err, warn};
use crate::store::{AllocationStore, Record};

impl AllocationStore for DiskStore {
    fn is_taken(&self, ip: IpAddr) -> bool {
        self.addresses.contains(&ip)
    }

    fn held_by(&mut self, container_id: &str, ifname: &str) -> Result<Vec<(usize, IpAddr)>> {
        let mine = self.attachments_of(container_id, ifname);
        let mut held = Vec::with_capacity(mine.len());
        for attachment in mine {
            if self.is_live(&attachment)? {
                held.push((attachment.range_set, attachment.address));
            }
        }
        held.sort_unstable();
        Ok(held)
    }

    fn owner(&self, ip: IpAddr) -> Option<Record> {
        self.read_record(&ip.to_string()).ok()
    }

    fn reserve(&mut self, record: &Record) -> Result<bool> {
        if self.is_taken(record.address) {
            return Ok(false);
        }
        let key = attachment_key(&record.container_id, &record.ifname);
        let attachment = AttachmentName::new(&key, record.range_set, record.address);
        let ours = self.path(&attachment.name);
        let text = serde_json::to_vec(record).map_err(|e| Error::Store(e.to_string()))?;
        let create = || OpenOptions::new().write(true).create_new(true).open(&ours);
        let written = (|| {
            let mut file = match create() {
                // Left by an earlier attempt that failed; not linked, so not a record.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    std::fs::remove_file(&ours)?;
                    create()?
                }
                other => other?,
            };
            file.write_all(&text)?;
            Ok(file)
        })();
        let file = match written {
            Ok(file) => file,
            Err(e) => {
                let _ = std::fs::remove_file(&ours);
                return Err(store_err("writing", &ours, e));
            }
        };
        let address = self.path(&record.address.to_string());
        // The allocation itself: link() never replaces an existing name.
        match std::fs::hard_link(&ours, &address) {
            Ok(()) => {}
            Err(e) => {
                let _ = std::fs::remove_file(&ours);
                if e.kind() == ErrorKind::AlreadyExists {
                    // Created by someone not honouring the lock: never ours to take.
                    self.addresses.insert(record.address);
                    return Ok(false);
                }
                return Err(store_err("linking", &address, e));
            }
        }
        self.dirty = true;
        if self.fsync {
            self.unsynced.push(file);
        }
        self.addresses.insert(record.address);
        self.attachments.push(attachment);
        Ok(true)
    }

    fn release(&mut self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>> {
        let mine = self.attachments_of(container_id, ifname);
        let mut released = Vec::new();
        for attachment in mine {
            if self.release_one(&attachment, container_id, ifname)? {
                released.push(attachment.address);
            }
        }
        Ok(released)
    }

    fn unreserve(&mut self, record: &Record) -> Result<()> {
        let key = attachment_key(&record.container_id, &record.ifname);
        let attachment = AttachmentName::new(&key, record.range_set, record.address);
        self.release_one(&attachment, &record.container_id, &record.ifname)
            .map(|_| ())
    }

    fn records(&mut self) -> Result<Vec<Record>> {
        let all = self.attachments.clone();
        let mut records = Vec::with_capacity(all.len());
        for attachment in all {
            if !self.is_live(&attachment)? {
                continue;
            }
            match self.read_record(&attachment.name) {
                Ok(record)
                    if record.address == attachment.address
                        && attachment_key(&record.container_id, &record.ifname)
                            == attachment.key =>
                {
                    records.push(record)
                }
                Ok(_) => warn(
                    &self.dir,
                    format_args!(
                        "{} does not match its name; skipped and left alone",
                        attachment.name
                    ),
                ),
                Err(reason) => warn(
                    &self.dir,
                    format_args!(
                        "record of {} is unreadable ({reason}); skipped and left alone, its address stays out of use",
                        attachment.address
                    ),
                ),
            }
        }
        Ok(records)
    }

    fn last_reserved(&self, range_set: usize) -> Option<IpAddr> {
        // A missing or unreadable pointer only means the walk starts over.
        std::fs::read_link(self.path(&format!("{LAST_RESERVED}{range_set}")))
            .ok()
            .and_then(|target| target.to_str()?.parse().ok())
    }

    fn set_last_reserved(&mut self, range_set: usize, ip: IpAddr) -> Result<()> {
        self.replace_link(&format!("{LAST_RESERVED}{range_set}"), &ip.to_string())
    }

    /// Releases the lock, then flushes: see "Durability" above. The store
    /// is not used after its commit, except to take back a failed ADD's own
    /// records (safe unlocked: link() made them ours alone).
    fn commit(&mut self) -> Result<()> {
        if self.fsync && self.dirty {
            self.lock = None;
            for file in self.unsynced.drain(..) {
                file.sync_data()
                    .map_err(|e| store_err("flushing a record in", &self.dir, e))?;
            }
            File::open(&self.dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| store_err("flushing", &self.dir, e))?;
        }
        self.dirty = false;
        Ok(())
    }
}
