//! The PostgreSQL store's schema: its tables, migrations, advisory lock
//! keys and every statement the engine and the lease send.

use crate::store::SCHEMA_VERSION;

/// The advisory lock that makes one server per database. Any fixed number
/// would do; this one is the FNV-1a hash of "subagentd", so it is unlikely
/// to be a number another application in the same database locks.
pub(super) const LOCK_KEY: i64 = fnv1a(b"subagentd") as i64;

/// Serializes schema changes between servers starting at once:
/// `CREATE TABLE IF NOT EXISTS` is not safe against a concurrent create of
/// the same table (the loser fails with "already exists"), so every
/// transaction that creates or migrates tables first takes this
/// transaction-scoped lock (key: the FNV-1a hash of "subagentd-ddl").
pub(super) const DDL_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";
pub(super) const DDL_LOCK_KEY: i64 = fnv1a(b"subagentd-ddl") as i64;

pub(super) const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

// The keys of `subagentd_meta`, as in the embedded store's `meta` table.
pub(super) const SCHEMA: &str = "schema_version";
pub(super) const LAST_SEQUENCE: &str = "last_sequence";
pub(super) const EVICTED_THROUGH: &str = "evicted_through";
pub(super) const NEXT_ADMISSION: &str = "next_admission";

pub(super) const CREATE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS subagentd_agents (
        id uuid PRIMARY KEY,
        seq bigint NOT NULL,
        row bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS subagentd_events (
        seq bigint PRIMARY KEY,
        row bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS subagentd_meta (
        key text PRIMARY KEY,
        value bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS subagentd_conversations (
        id uuid PRIMARY KEY,
        row bytea NOT NULL
    );";

/// Migrations from each older schema version to the next: entry `i`
/// upgrades version `i + 1` to `i + 2`, as SQL run inside the transaction
/// that records the new version.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1 → 2: a field added to agent rows, which version 1 rows lack (see
    // SCHEMA_VERSION): nothing to rewrite.
    "",
    // 2 → 3: the leader lease, whose table `prepare` creates with the
    // others in every version.
    "",
    // 3 → 4: the conversations table, which `prepare` creates with the
    // others; older agent rows need no rewrite.
    "",
];
// One per version step, or a database of the missing step's version would
// be recorded as current without its migration.
const _: () = assert!(MIGRATIONS.len() == SCHEMA_VERSION as usize - 1);

pub(super) const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1)";
pub(super) const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
pub(super) const GET_SCHEMA: &str = "SELECT value FROM subagentd_meta WHERE key = $1";
pub(super) const PUT_META: &str = "INSERT INTO subagentd_meta (key, value) \
     SELECT * FROM UNNEST($1::text[], $2::bigint[]) \
     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value";

// A server or database configured with `synchronous_commit = off` would
// acknowledge a COMMIT before its WAL is flushed; the Store contract is
// that `Ok` means durable, so each commit asks for the flush.
pub(super) const SYNCHRONOUS_COMMIT: &str = "SET LOCAL synchronous_commit TO on";
pub(super) const UPSERT_AGENTS: &str = "INSERT INTO subagentd_agents (id, seq, row) \
     SELECT * FROM UNNEST($1::uuid[], $2::bigint[], $3::bytea[]) \
     ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, row = EXCLUDED.row";
pub(super) const DELETE_AGENTS: &str = "DELETE FROM subagentd_agents WHERE id = ANY($1::uuid[])";
pub(super) const INSERT_EVENTS: &str = "INSERT INTO subagentd_events (seq, row) \
     SELECT * FROM UNNEST($1::bigint[], $2::bytea[]) \
     ON CONFLICT (seq) DO UPDATE SET row = EXCLUDED.row";
// Bounded below by the previous commit's `evicted_through`: the rows at or
// under it are gone, but until vacuum their dead index entries are not,
// and an unbounded `seq <= $2` would walk all of them on every commit.
pub(super) const EVICT_EVENTS: &str = "DELETE FROM subagentd_events WHERE seq > $1 AND seq <= $2";
pub(super) const UPSERT_CONVERSATIONS: &str = "INSERT INTO subagentd_conversations (id, row) \
     SELECT * FROM UNNEST($1::uuid[], $2::bytea[]) \
     ON CONFLICT (id) DO UPDATE SET row = EXCLUDED.row";
pub(super) const DELETE_CONVERSATIONS: &str =
    "DELETE FROM subagentd_conversations WHERE id = ANY($1::uuid[])";

/// The lease's epoch, locked against a take-over until this commit ends:
/// a standby's take-over waits for the commit, and a commit after the
/// take-over sees the new epoch.
pub(super) const FENCE: &str = "SELECT epoch FROM subagentd_lease WHERE id = 1 FOR SHARE";

pub(super) const LOAD_AGENTS: &str = "SELECT row FROM subagentd_agents ORDER BY seq";
pub(super) const LOAD_EVENTS: &str = "SELECT seq, row FROM subagentd_events ORDER BY seq";
pub(super) const LOAD_META: &str = "SELECT key, value FROM subagentd_meta";
pub(super) const LOAD_CONVERSATIONS: &str = "SELECT row FROM subagentd_conversations";

pub(super) const CREATE_LEASE: &str = "CREATE TABLE IF NOT EXISTS subagentd_lease (
        id smallint PRIMARY KEY CHECK (id = 1),
        holder text NOT NULL,
        epoch bigint NOT NULL,
        expires_at timestamptz NOT NULL
    )";
