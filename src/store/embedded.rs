//! The embedded store: one redb file in the data directory.
//!
//! redb gives what the write path needs and nothing to hand-write: a
//! crash-safe copy-on-write B-tree, multi-table transactions with one fsync
//! per commit, and a lock on the file so that a second process cannot open
//! it (its default `ExclusiveWriter` mode).

use std::path::{Path, PathBuf};

use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

use super::{Batch, Contents, Store, StoreError, SCHEMA_VERSION};
use crate::scheduler::durable::LogPosition;

/// The file inside the data directory.
pub const FILE_NAME: &str = "subagentd.redb";

const AGENTS: TableDefinition<u128, &[u8]> = TableDefinition::new("agents");
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const CONVERSATIONS: TableDefinition<u128, &[u8]> = TableDefinition::new("conversations");

const SCHEMA: &str = "schema_version";
const LAST_SEQUENCE: &str = "last_sequence";
const EVICTED_THROUGH: &str = "evicted_through";
const NEXT_ADMISSION: &str = "next_admission";

/// Migrations from each older schema version to the next: entry `i`
/// upgrades version `i + 1` to `i + 2`.
const MIGRATIONS: &[Migration] = &[v1_to_v2, v2_to_v3, v3_to_v4];
// One per version step, or a store of the missing step's version would be
// recorded as current without its migration.
const _: () = assert!(MIGRATIONS.len() == SCHEMA_VERSION as usize - 1);

/// Rewrites what one schema version stored into the next version's form,
/// inside the transaction that records the new version.
type Migration = fn(&WriteTransaction) -> Result<(), redb::Error>;

/// Version 2 added a field to agent rows that version 1 rows lack (see
/// [`SCHEMA_VERSION`]): nothing to rewrite.
fn v1_to_v2(_: &WriteTransaction) -> Result<(), redb::Error> {
    Ok(())
}

/// Version 3 added the PostgreSQL leader lease: nothing here.
fn v2_to_v3(_: &WriteTransaction) -> Result<(), redb::Error> {
    Ok(())
}

/// Version 4 added the `conversations` table, which `prepare` opens (and
/// so creates) in every version: older agent rows need no rewrite.
fn v3_to_v4(_: &WriteTransaction) -> Result<(), redb::Error> {
    Ok(())
}

/// An open embedded store; holds the file's lock until dropped.
pub struct EmbeddedStore {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.path)
            .finish()
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store in directory `dir`, migrating an older
    /// schema and refusing a newer one.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Engine(format!(
                "cannot create the data directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join(FILE_NAME);
        let db = Database::create(&path).map_err(|e| match e {
            DatabaseError::DatabaseAlreadyOpen => StoreError::Locked { path: path.clone() },
            other => StoreError::Engine(format!("cannot open {}: {other}", path.display())),
        })?;
        let store = Self { db, path };
        store.prepare()?;
        Ok(store)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the tables and records the schema version of a new store;
    /// migrates an older one; refuses a newer one.
    fn prepare(&self) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(engine)?;
        let found = {
            let mut meta = tx.open_table(META).map_err(engine)?;
            let found = meta.get(SCHEMA).map_err(engine)?.map(|v| v.value());
            if found.is_none() {
                meta.insert(SCHEMA, u64::from(SCHEMA_VERSION))
                    .map_err(engine)?;
            }
            found
        };
        tx.open_table(AGENTS).map_err(engine)?;
        tx.open_table(EVENTS).map_err(engine)?;
        tx.open_table(CONVERSATIONS).map_err(engine)?;
        if let Some(found) = found {
            let found = u32::try_from(found).unwrap_or(u32::MAX);
            if found > SCHEMA_VERSION {
                return Err(StoreError::NewerSchema {
                    where_: self.path.display().to_string(),
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            for migrate in MIGRATIONS.iter().skip((found.max(1) - 1) as usize) {
                migrate(&tx).map_err(engine)?;
            }
            tx.open_table(META)
                .map_err(engine)?
                .insert(SCHEMA, u64::from(SCHEMA_VERSION))
                .map_err(engine)?;
        }
        tx.commit().map_err(engine)
    }

    #[cfg(test)]
    fn set_schema_version(&self, version: u64) {
        let tx = self.db.begin_write().unwrap();
        tx.open_table(META)
            .unwrap()
            .insert(SCHEMA, version)
            .unwrap();
        tx.commit().unwrap();
    }
}

/// Every row of an id-keyed table, in key order.
fn rows_of(
    tx: &redb::ReadTransaction,
    table: TableDefinition<u128, &[u8]>,
) -> Result<Vec<Vec<u8>>, StoreError> {
    tx.open_table(table)
        .map_err(engine)?
        .iter()
        .map_err(engine)?
        .map(|row| row.map(|(_, v)| v.value().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(engine)
}

fn engine(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Engine(format!("embedded store: {}", e.into()))
}

impl Store for EmbeddedStore {
    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        // Durability::Immediate (the default): commit returns after fsync.
        let tx = self.db.begin_write().map_err(engine)?;
        {
            let mut agents = tx.open_table(AGENTS).map_err(engine)?;
            for (id, row) in &batch.agents {
                match row {
                    Some(row) => agents.insert(id.as_u128(), row.as_slice()),
                    None => agents.remove(id.as_u128()).map(|_| None),
                }
                .map_err(engine)?;
            }
            let mut conversations = tx.open_table(CONVERSATIONS).map_err(engine)?;
            for (id, row) in &batch.conversations {
                match row {
                    Some(row) => conversations.insert(id.as_u128(), row.as_slice()),
                    None => conversations.remove(id.as_u128()).map(|_| None),
                }
                .map_err(engine)?;
            }
            let mut events = tx.open_table(EVENTS).map_err(engine)?;
            for (seq, row) in &batch.events {
                events.insert(*seq, row.as_slice()).map_err(engine)?;
            }
            let p = batch.position;
            if p.evicted_through > 0 {
                events
                    .retain_in(..=p.evicted_through, |_, _| false)
                    .map_err(engine)?;
            }
            let mut meta = tx.open_table(META).map_err(engine)?;
            meta.insert(LAST_SEQUENCE, p.last_sequence)
                .map_err(engine)?;
            meta.insert(EVICTED_THROUGH, p.evicted_through)
                .map_err(engine)?;
            meta.insert(NEXT_ADMISSION, p.next_admission)
                .map_err(engine)?;
        }
        tx.commit().map_err(engine)
    }

    fn load(&mut self) -> Result<Contents, StoreError> {
        let tx = self.db.begin_read().map_err(engine)?;
        let agents = rows_of(&tx, AGENTS)?;
        let events = tx
            .open_table(EVENTS)
            .map_err(engine)?
            .iter()
            .map_err(engine)?
            .map(|row| row.map(|(k, v)| (k.value(), v.value().to_vec())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(engine)?;
        let conversations = rows_of(&tx, CONVERSATIONS)?;
        let meta = tx.open_table(META).map_err(engine)?;
        let get = |key| -> Result<u64, StoreError> {
            Ok(meta.get(key).map_err(engine)?.map_or(0, |v| v.value()))
        };
        Ok(Contents {
            agents,
            events,
            position: LogPosition {
                last_sequence: get(LAST_SEQUENCE)?,
                evicted_through: get(EVICTED_THROUGH)?,
                next_admission: get(NEXT_ADMISSION)?,
            },
            conversations,
        })
    }

    fn describe(&self) -> String {
        format!("embedded store {}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::tests::conformance;

    #[test]
    fn the_embedded_store_keeps_what_each_commit_wrote() {
        let dir = tempfile::tempdir().unwrap();
        conformance(|| Box::new(EmbeddedStore::open(dir.path()).unwrap()));
    }

    #[test]
    fn a_store_of_schema_version_1_is_migrated_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let open = || EmbeddedStore::open(dir.path()).unwrap();
        crate::store::memory::tests::migrates_from_version_1(
            || Box::new(open()),
            |v| open().set_schema_version(v),
            || {
                // Read without opening through `EmbeddedStore`, which would
                // migrate first.
                let db = Database::create(dir.path().join(FILE_NAME)).unwrap();
                let tx = db.begin_read().unwrap();
                let meta = tx.open_table(META).unwrap();
                meta.get(SCHEMA).unwrap().unwrap().value()
            },
        );
    }

    #[test]
    fn a_second_open_of_the_same_store_fails_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let _first = EmbeddedStore::open(dir.path()).unwrap();
        let err = EmbeddedStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&dir.path().join(FILE_NAME).display().to_string()),
            "{msg}"
        );
    }

    #[test]
    fn a_store_of_a_newer_schema_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        EmbeddedStore::open(dir.path())
            .unwrap()
            .set_schema_version(u64::from(SCHEMA_VERSION) + 1);
        let err = EmbeddedStore::open(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, StoreError::NewerSchema { found, supported, .. }
                if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("this subagentd's {SCHEMA_VERSION}")),
            "{msg}"
        );
    }

    #[test]
    fn a_new_store_records_the_current_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).unwrap();
        let tx = store.db.begin_read().unwrap();
        let meta = tx.open_table(META).unwrap();
        assert_eq!(
            meta.get(SCHEMA).unwrap().map(|v| v.value()),
            Some(u64::from(SCHEMA_VERSION))
        );
    }
}
