//! Conversations: the chain of agents that continue one another, and the
//! transcript each keeps.
//!
//! A conversation is a list of turns, one per agent: the first agent's id
//! names it, and each continuation appends the next turn. A fork starts a
//! new conversation (named by the fork's id) with a copy of the turns up to
//! the agent it forked from. Turns hold what a continuation inherits (agent
//! type, model, parent, lead, labels, the runner's session), so an agent
//! can be continued after its own record is gone, for as long as its
//! conversation is retained.
//!
//! [`Conversations`] owns them all and knows no scheduler internals: the
//! core tells it about spawns, steers, tool calls and ends, and asks it
//! whether an agent may be continued. It is also the durable form: the
//! store writes a conversation's [`row`] whole each time it changes.
//!
//! A conversation whose latest turn ended (nearly all of them, kept for a
//! day by default) is held as that row and decoded only when it is read
//! or continued: see [`row`] for what that saves.

pub mod row;

use std::{
    borrow::Cow,
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, SystemTime},
};

use foldhash::{HashMap, HashSet};

use super::types::{AgentError, AgentId, AgentStatus, Labels, Workspace};

/// A conversation's id: the id of its first agent (a fork's own id).
pub type ConversationId = AgentId;

pub use crate::config::conversations::{
    DEFAULT_MAX_TRANSCRIPT_BYTES, DEFAULT_RETENTION, MIN_MAX_TRANSCRIPT_BYTES,
};

/// What an entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// The prompt the turn's agent was spawned with.
    Prompt,
    /// A steer message sent to it.
    Steer,
    /// A tool call its run reported (the text is the tool's name).
    ToolCall,
    /// How the turn ended; the text is its output.
    Result {
        /// DONE, FAILED or CANCELLED.
        status: AgentStatus,
        /// Why, unless DONE.
        error: Option<AgentError>,
        /// What the turn's run left in its workspace, once saved (a type
        /// with a workspace; a stopped run's arrives after its end).
        workspace: Option<Arc<Workspace>>,
    },
}

/// One entry of a transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What it records.
    pub kind: EntryKind,
    /// When.
    pub at: SystemTime,
    /// The prompt, message, tool name or output.
    pub text: Arc<str>,
}

/// What a continuation inherits from the turn it continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inherited {
    /// Agent type.
    pub agent: Arc<str>,
    /// "provider/model".
    pub model: Arc<str>,
    /// Parent agent, if any.
    pub parent_id: Option<AgentId>,
    /// Lead.
    pub lead_id: Option<Arc<str>>,
    /// Caller labels.
    pub labels: Labels,
}

/// One agent's turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The agent.
    pub agent_id: AgentId,
    /// Copied from the conversation a fork started from: the agent's own
    /// turn is in that one.
    pub copied: bool,
    /// What a continuation of this turn inherits.
    pub inherited: Inherited,
    /// The opaque session the run reported (a worker's or a program's own
    /// session id), handed to the run that continues it.
    pub session: Option<Arc<str>>,
    /// When and how it ended; None while the agent is live.
    pub ended: Option<(SystemTime, AgentStatus)>,
    /// Its entries, oldest first (the oldest of the conversation may have
    /// been elided).
    pub entries: Vec<Entry>,
}

/// Entries removed to keep a transcript within its size bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Elided {
    /// How many entries.
    pub entries: u64,
    /// How many bytes of text (an entry cut short counts its cut bytes).
    pub bytes: u64,
    /// When the latest were removed.
    pub at: Option<SystemTime>,
}

impl Elided {
    /// Whether anything was removed.
    pub fn any(&self) -> bool {
        self.entries > 0 || self.bytes > 0
    }

    /// The marker entry's text.
    pub fn notice(&self) -> String {
        format!(
            "{} earlier transcript entries ({} bytes) were elided to keep the transcript within \
             [conversations] max_transcript_bytes",
            self.entries, self.bytes
        )
    }
}

/// A conversation: its turns, oldest first (turn `n` is `turns[n - 1]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// Its id: the first agent's.
    pub id: ConversationId,
    /// The tenant of its agents.
    pub tenant: Arc<str>,
    /// Its turns.
    pub turns: Vec<Turn>,
    /// What the size bound removed.
    pub elided: Elided,
}

impl Conversation {
    /// Bytes of text of its entries.
    pub fn text_bytes(&self) -> usize {
        self.turns
            .iter()
            .flat_map(|t| &t.entries)
            .map(|e| e.text.len())
            .sum()
    }

    /// The latest turn (every conversation has one).
    pub fn latest(&self) -> &Turn {
        self.turns.last().expect("a conversation has a turn")
    }

    /// The turns [`Conversations::place`] finds through `placed`: its own
    /// (not copied from the conversation a fork started from), except a
    /// first turn, which the conversation's id names.
    fn placed_turns(&self) -> impl Iterator<Item = (AgentId, Place)> + '_ {
        self.turns
            .iter()
            .zip(1u32..)
            .filter(|(t, n)| !t.copied && (t.agent_id != self.id || *n != 1))
            .map(|(t, turn)| {
                let place = Place {
                    conversation: self.id,
                    turn,
                };
                (t.agent_id, place)
            })
    }

    /// When its latest agent ended; None while it is live.
    pub fn ended_at(&self) -> Option<SystemTime> {
        self.latest().ended.map(|(at, _)| at)
    }
}

/// Where an agent's own turn is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Its conversation.
    pub conversation: ConversationId,
    /// Its turn (1 for the first).
    pub turn: u32,
}

/// Why a Spawn may not continue an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Its conversation is not retained (or it never existed).
    Expired,
    /// The agent is live.
    Busy(AgentStatus),
    /// A later agent continued the conversation.
    NotLatest {
        /// The conversation's latest agent.
        latest: AgentId,
    },
}

/// What a continuation starts from.
#[derive(Debug, Clone)]
pub struct Continuable {
    /// The continued agent's place.
    pub from: Place,
    /// Its tenant.
    pub tenant: Arc<str>,
    /// What the new agent inherits.
    pub inherited: Inherited,
}

/// An entry with the agent and turn it belongs to.
pub type PlacedEntry = (AgentId, u32, Entry);

/// The history a continued run starts with: the turns before its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// Its conversation.
    pub conversation_id: ConversationId,
    /// Entries of the earlier turns, oldest first, each with its agent and
    /// turn.
    pub entries: Vec<PlacedEntry>,
    /// What the size bound removed before them.
    pub elided: Elided,
    /// The session the previous turn's run reported.
    pub session: Option<Arc<str>>,
}

/// A retained conversation.
#[derive(Debug)]
enum Held {
    /// Its latest turn is live: values, changed in place.
    Open(Box<Conversation>),
    /// Its latest turn ended: its [`row`], decoded when read.
    Ended(Box<[u8]>),
}

/// Every retained conversation. See the module docs.
#[derive(Debug, Default)]
pub struct Conversations {
    by_id: HashMap<ConversationId, Held>,
    /// Ended conversations with turns in `placed`, which their removal
    /// must find (most have none, and are removed without decoding).
    ended_with_placed: HashSet<ConversationId>,
    /// Where rows are encoded before each is copied into an allocation of
    /// its own size.
    scratch: Vec<u8>,
    /// Agents whose own turn is not turn 1 of the conversation named by
    /// their id: continuations and forks. Most agents never continue and
    /// are found by their id alone.
    placed: HashMap<AgentId, Place>,
    /// Ended conversations by when their latest agent ended.
    expiry: BTreeSet<(SystemTime, ConversationId)>,
    retention: Duration,
    max_bytes: usize,
    /// Changed since the store last took them; None when nothing is stored.
    unsaved: Option<Unsaved>,
}

#[derive(Debug, Default)]
struct Unsaved {
    changed: HashSet<ConversationId>,
    removed: Vec<ConversationId>,
}

impl Conversations {
    /// No conversations, keeping each for `retention` after its latest
    /// agent ended, each transcript within `max_bytes` of text.
    pub fn new(retention: Duration, max_bytes: usize) -> Self {
        Self {
            retention,
            max_bytes: max_bytes.max(MIN_MAX_TRANSCRIPT_BYTES),
            ..Self::default()
        }
    }

    /// Applies reloaded settings: a smaller bound applies as each
    /// transcript next grows.
    pub fn configure(&mut self, retention: Duration, max_bytes: usize) {
        self.retention = retention;
        self.max_bytes = max_bytes.max(MIN_MAX_TRANSCRIPT_BYTES);
    }

    /// `[conversations] retention`.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// `[conversations] max_transcript_bytes`.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Retained conversations.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is retained.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Keeps changes for [`Conversations::take_changes`] from now on.
    pub fn track_changes(&mut self) {
        self.unsaved.get_or_insert_with(Unsaved::default);
    }

    /// Where `agent`'s own turn is, while its conversation is retained.
    pub fn place(&self, agent: AgentId) -> Option<Place> {
        if let Some(place) = self.placed.get(&agent) {
            return Some(*place);
        }
        // A conversation not found through `placed` is named by its own
        // first turn's agent: the one conversation whose first turn is not
        // its namesake's is a fork's, and a fork is in `placed`.
        let first = match self.by_id.get(&agent)? {
            Held::Open(c) => c
                .turns
                .first()
                .is_some_and(|t| t.agent_id == agent && !t.copied),
            Held::Ended(_) => true,
        };
        first.then_some(Place {
            conversation: agent,
            turn: 1,
        })
    }

    /// The conversation `id`, when retained (decoded when it has ended).
    pub fn get(&self, id: ConversationId) -> Option<Cow<'_, Conversation>> {
        match self.by_id.get(&id)? {
            Held::Open(c) => Some(Cow::Borrowed(&**c)),
            Held::Ended(row) => decoded(id, row).map(Cow::Owned),
        }
    }

    /// The first turn of a new conversation, named by `agent`'s id.
    pub fn begin(
        &mut self,
        agent: AgentId,
        tenant: Arc<str>,
        inherited: Inherited,
        prompt: Arc<str>,
        at: SystemTime,
    ) {
        let turn = Turn::new(agent, inherited, prompt, at);
        let c = Conversation {
            id: agent,
            tenant,
            turns: vec![turn],
            elided: Elided::default(),
        };
        self.by_id.insert(agent, Held::Open(Box::new(c)));
        // Not saved now: a live agent's first turn is rebuilt from its own
        // stored record; the conversation is written when the turn ends.
        self.bound(agent, at);
    }

    /// Whether `from` (an agent id a caller in `tenant` named) may be
    /// continued, or forked when `fork`.
    pub fn continuable(
        &self,
        tenant: &str,
        from: AgentId,
        fork: bool,
    ) -> Result<Continuable, Refusal> {
        let place = self.place(from).ok_or(Refusal::Expired)?;
        let c = self.get(place.conversation).ok_or(Refusal::Expired)?;
        if &*c.tenant != tenant {
            return Err(Refusal::Expired);
        }
        let turn = &c.turns[place.turn as usize - 1];
        if turn.ended.is_none() {
            // Live: the agent the caller named is this turn's.
            return Err(Refusal::Busy(AgentStatus::Running));
        }
        if !fork && place.turn as usize != c.turns.len() {
            return Err(Refusal::NotLatest {
                latest: c.latest().agent_id,
            });
        }
        Ok(Continuable {
            from: place,
            tenant: c.tenant.clone(),
            inherited: turn.inherited.clone(),
        })
    }

    /// Appends `agent`'s turn to the conversation of `from` (checked by
    /// [`Conversations::continuable`]). Returns the new turn's number.
    pub fn continue_with(
        &mut self,
        from: Place,
        agent: AgentId,
        inherited: Inherited,
        prompt: Arc<str>,
        at: SystemTime,
    ) -> u32 {
        let ended = self
            .open(from.conversation)
            .expect("checked continuable")
            .ended_at();
        if let Some(ended) = ended {
            self.expiry.remove(&(ended, from.conversation));
        }
        let c = self.open(from.conversation).expect("opened above");
        c.turns.push(Turn::new(agent, inherited, prompt, at));
        let turn = c.turns.len() as u32;
        self.placed.insert(
            agent,
            Place {
                conversation: from.conversation,
                turn,
            },
        );
        self.bound(from.conversation, at);
        self.changed(from.conversation);
        turn
    }

    /// Starts the conversation `agent` (a fork of `from`) with a copy of
    /// the turns up to `from`'s. Returns the fork's turn number.
    pub fn fork(
        &mut self,
        from: Place,
        agent: AgentId,
        inherited: Inherited,
        prompt: Arc<str>,
        at: SystemTime,
    ) -> u32 {
        let source = self.get(from.conversation).expect("checked continuable");
        let mut turns: Vec<Turn> = source.turns[..from.turn as usize].to_vec();
        for t in &mut turns {
            t.copied = true;
        }
        turns.push(Turn::new(agent, inherited, prompt, at));
        let turn = turns.len() as u32;
        let c = Conversation {
            id: agent,
            tenant: source.tenant.clone(),
            turns,
            elided: source.elided,
        };
        self.by_id.insert(agent, Held::Open(Box::new(c)));
        self.placed.insert(
            agent,
            Place {
                conversation: agent,
                turn,
            },
        );
        self.bound(agent, at);
        self.changed(agent);
        turn
    }

    /// Appends an entry (a steer message, a tool call) to `agent`'s live
    /// turn. A steer was acknowledged to its sender, so the conversation is
    /// written with the change that delivered it; tool calls (reported by
    /// the run, counted in its stored usage) are written when the turn
    /// ends, so a crash loses only a live turn's tool-call entries.
    pub fn record(&mut self, agent: AgentId, kind: EntryKind, text: Arc<str>, at: SystemTime) {
        let Some((place, turn)) = self.live_turn_mut(agent) else {
            return;
        };
        let steer = kind == EntryKind::Steer;
        turn.entries.push(Entry { kind, at, text });
        self.bound(place.conversation, at);
        if steer {
            self.changed(place.conversation);
        }
    }

    /// Records the session a run reported, for the run that continues it.
    pub fn set_session(&mut self, agent: AgentId, session: Arc<str>) {
        let Some(place) = self.place(agent) else {
            return;
        };
        if let Some(turn) = self.turn_mut(place) {
            turn.session = Some(session);
            self.changed(place.conversation);
        }
        self.settle(place.conversation);
    }

    /// `agent`'s run saved its workspace after its turn ended (it was
    /// stopped): the turn's result entry shows it too.
    pub fn set_workspace(&mut self, agent: AgentId, saved: &Arc<Workspace>) {
        let Some(place) = self.place(agent) else {
            return;
        };
        let Some(turn) = self.turn_mut(place) else {
            return;
        };
        let result = turn
            .entries
            .iter_mut()
            .rev()
            .find_map(|e| match &mut e.kind {
                EntryKind::Result { workspace, .. } => Some(workspace),
                _ => None,
            });
        if let Some(workspace) = result {
            *workspace = Some(saved.clone());
            self.changed(place.conversation);
        }
        self.settle(place.conversation);
    }

    /// `agent`'s turn ended: its result entry, and the conversation's
    /// retention starts when it is the latest turn.
    pub fn end(
        &mut self,
        agent: AgentId,
        status: AgentStatus,
        error: Option<AgentError>,
        workspace: Option<Arc<Workspace>>,
        output: Arc<str>,
        at: SystemTime,
    ) {
        let Some((place, turn)) = self.live_turn_mut(agent) else {
            return;
        };
        turn.entries.push(Entry {
            kind: EntryKind::Result {
                status,
                error,
                workspace,
            },
            at,
            text: output,
        });
        turn.ended = Some((at, status));
        self.expiry.insert((at, place.conversation));
        self.bound(place.conversation, at);
        self.changed(place.conversation);
        // A live turn is always the latest: now none is live.
        self.pack(place.conversation);
    }

    /// The history a run of `agent` starts with: the turns before its own.
    /// None for the first turn of a conversation (nothing came before).
    pub fn history(&self, agent: AgentId) -> Option<History> {
        let place = self.place(agent)?;
        if place.turn < 2 {
            return None;
        }
        let c = self.get(place.conversation)?;
        let before = &c.turns[..place.turn as usize - 1];
        Some(History {
            conversation_id: c.id,
            entries: entries_of(before),
            elided: c.elided,
            session: before.last().and_then(|t| t.session.clone()),
        })
    }

    /// The transcript up to and including `agent`'s turn (`Some(agent)`),
    /// or all of `conversation`: the conversation id, the elision and every
    /// entry with its agent and turn, oldest first. None when not retained
    /// or of a tenant `admits` refuses.
    pub fn transcript(
        &self,
        target: TranscriptOf,
        admits: impl Fn(&str) -> bool,
    ) -> Option<(ConversationId, Elided, Vec<PlacedEntry>)> {
        let (c, upto) = match target {
            TranscriptOf::Agent(agent) => {
                let place = self.place(agent)?;
                (self.get(place.conversation)?, place.turn as usize)
            }
            TranscriptOf::Conversation(id) => {
                let c = self.get(id)?;
                let turns = c.turns.len();
                (c, turns)
            }
        };
        if !admits(&c.tenant) {
            return None;
        }
        Some((c.id, c.elided, entries_of(&c.turns[..upto])))
    }

    /// Forgets conversations whose latest agent ended `retention` or more
    /// before `now`. Returns how many.
    pub fn sweep(&mut self, now: SystemTime) -> usize {
        let mut n = 0;
        while let Some(&(at, id)) = self.expiry.first() {
            if at + self.retention > now {
                break;
            }
            self.expiry.pop_first();
            if let Some(held) = self.by_id.remove(&id) {
                let c: Option<Cow<'_, Conversation>> = match held {
                    Held::Open(c) => Some(Cow::Owned(*c)),
                    Held::Ended(row) if self.ended_with_placed.remove(&id) => {
                        decoded(id, &row).map(Cow::Owned)
                    }
                    Held::Ended(_) => None,
                };
                for (agent, _) in c.iter().flat_map(|c| c.placed_turns()) {
                    self.placed.remove(&agent);
                }
                if let Some(u) = self.unsaved.as_mut() {
                    u.changed.remove(&id);
                    u.removed.push(id);
                }
                n += 1;
            }
        }
        n
    }

    /// Conversations changed since the last call (each one's [`row`] as
    /// it is now), and those retention removed.
    pub fn take_changes(&mut self) -> (Vec<(ConversationId, Vec<u8>)>, Vec<ConversationId>) {
        let Some(u) = self.unsaved.as_mut() else {
            return (Vec::new(), Vec::new());
        };
        let changed = std::mem::take(&mut u.changed);
        let removed = std::mem::take(&mut u.removed);
        let changed = changed
            .into_iter()
            .filter_map(|id| {
                let row = match self.by_id.get(&id)? {
                    // Ended: the bytes it is kept as.
                    Held::Ended(row) => row.to_vec(),
                    Held::Open(c) => {
                        let mut row = Vec::new();
                        row::encode(c, &mut row);
                        row
                    }
                };
                Some((id, row))
            })
            .collect();
        (changed, removed)
    }

    /// Puts back a stored conversation (recovery).
    pub fn restore(&mut self, c: Conversation) {
        let id = c.id;
        self.placed.extend(c.placed_turns());
        let ended = c.ended_at();
        self.by_id.insert(id, Held::Open(Box::new(c)));
        if let Some(at) = ended {
            self.expiry.insert((at, id));
            self.pack(id);
        }
    }

    /// Keeps conversation `id` as its row from now on (its latest turn
    /// ended).
    fn pack(&mut self, id: ConversationId) {
        let Some(held) = self.by_id.get_mut(&id) else {
            return;
        };
        let Held::Open(c) = held else {
            return;
        };
        self.scratch.clear();
        row::encode(c, &mut self.scratch);
        if c.placed_turns().next().is_some() {
            self.ended_with_placed.insert(id);
        }
        *held = Held::Ended(self.scratch.as_slice().into());
        // A transcript may have been long: do not keep its buffer.
        if self.scratch.capacity() > SCRATCH_KEPT {
            self.scratch = Vec::new();
        }
    }

    /// Packs conversation `id` again after a change, if it has ended.
    fn settle(&mut self, id: ConversationId) {
        if let Some(Held::Open(c)) = self.by_id.get(&id) {
            if c.ended_at().is_some() {
                self.pack(id);
            }
        }
    }

    /// Conversation `id` as values, to change it (decoded when it had
    /// ended; [`Conversations::pack`] it again once done).
    fn open(&mut self, id: ConversationId) -> Option<&mut Conversation> {
        let held = self.by_id.get_mut(&id)?;
        if let Held::Ended(row) = held {
            let c = decoded(id, row)?;
            self.ended_with_placed.remove(&id);
            *held = Held::Open(Box::new(c));
        }
        match held {
            Held::Open(c) => Some(c),
            Held::Ended(_) => None,
        }
    }

    /// Marks `id` for the store.
    fn changed(&mut self, id: ConversationId) {
        if let Some(u) = self.unsaved.as_mut() {
            u.changed.insert(id);
        }
    }

    /// `agent`'s own turn while it has not ended.
    fn live_turn_mut(&mut self, agent: AgentId) -> Option<(Place, &mut Turn)> {
        let place = self.place(agent)?;
        // An ended conversation has no live turn.
        let Held::Open(c) = self.by_id.get_mut(&place.conversation)? else {
            return None;
        };
        let turn = c.turns.get_mut(place.turn as usize - 1)?;
        turn.ended.is_none().then_some((place, turn))
    }

    /// A turn to change: its conversation is opened, and must be packed
    /// again after when it had ended.
    fn turn_mut(&mut self, place: Place) -> Option<&mut Turn> {
        self.open(place.conversation)?
            .turns
            .get_mut(place.turn as usize - 1)
    }

    /// Keeps conversation `id` within the size bound: the oldest entries
    /// go first; the newest entry is cut short only when it alone is over.
    fn bound(&mut self, id: ConversationId, at: SystemTime) {
        let max = self.max_bytes;
        let Some(Held::Open(c)) = self.by_id.get_mut(&id) else {
            return;
        };
        let mut bytes = c.text_bytes();
        if bytes <= max {
            return;
        }
        let total: usize = c.turns.iter().map(|t| t.entries.len()).sum();
        let mut left = total;
        for turn in &mut c.turns {
            let mut cut = 0;
            while bytes > max && cut < turn.entries.len() && left > 1 {
                bytes -= turn.entries[cut].text.len();
                c.elided.entries += 1;
                c.elided.bytes += turn.entries[cut].text.len() as u64;
                cut += 1;
                left -= 1;
            }
            turn.entries.drain(..cut);
            if bytes <= max {
                break;
            }
        }
        if bytes > max {
            // One entry left, alone over the bound: keep its end (the most
            // recent output) and count the cut bytes.
            if let Some(e) = c.turns.iter_mut().rev().find_map(|t| t.entries.last_mut()) {
                let over = bytes - max;
                let mut start = over;
                while !e.text.is_char_boundary(start) {
                    start += 1;
                }
                c.elided.bytes += start as u64;
                e.text = e.text[start..].into();
            }
        }
        c.elided.at = Some(at);
    }
}

/// Scratch capacity kept between encodes: a one-turn row is ~100 bytes
/// plus its text.
const SCRATCH_KEPT: usize = 64 * 1024;

/// The conversation a row the scheduler encoded itself holds. It always
/// decodes; if it ever did not, the conversation reads as expired (and the
/// error is logged) rather than taking the scheduler down.
fn decoded(id: ConversationId, row: &[u8]) -> Option<Conversation> {
    row::decode(row)
        .map_err(|e| tracing::error!(conversation = %id, error = %e, "a kept conversation does not decode"))
        .ok()
}

/// One item of a transcript page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TranscriptItem {
    /// The elision notice (always first).
    Elided(Elided),
    /// An entry of a turn.
    Entry {
        /// The turn's agent.
        agent_id: AgentId,
        /// The turn.
        turn: u32,
        /// The entry.
        entry: Entry,
    },
}

/// A page of a transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptPage {
    /// The conversation.
    pub conversation_id: ConversationId,
    /// Its items, oldest first.
    pub items: Vec<TranscriptItem>,
    /// The position the next page starts at; None on the last page.
    pub next_after: Option<usize>,
}

/// Whose transcript GetTranscript reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranscriptOf {
    /// Up to and including this agent's turn.
    Agent(AgentId),
    /// The whole conversation.
    Conversation(ConversationId),
}

impl Turn {
    fn new(agent: AgentId, inherited: Inherited, prompt: Arc<str>, at: SystemTime) -> Self {
        Self {
            agent_id: agent,
            copied: false,
            inherited,
            session: None,
            ended: None,
            entries: {
                // Room for the prompt and the result, most turns' only
                // entries: a growing Vec would make room for four.
                let mut entries = Vec::with_capacity(2);
                entries.push(Entry {
                    kind: EntryKind::Prompt,
                    at,
                    text: prompt,
                });
                entries
            },
        }
    }
}

fn entries_of(turns: &[Turn]) -> Vec<PlacedEntry> {
    turns
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            t.entries
                .iter()
                .map(move |e| (t.agent_id, i as u32 + 1, e.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn inherited() -> Inherited {
        Inherited {
            agent: "simulated".into(),
            model: "p/m".into(),
            parent_id: None,
            lead_id: Some("lead".into()),
            labels: Labels::default(),
        }
    }

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    fn ended_conversation(c: &mut Conversations, at: u64) -> AgentId {
        let a = Uuid::now_v7();
        c.begin(a, "t".into(), inherited(), "first".into(), t(at));
        c.end(a, AgentStatus::Done, None, None, "one".into(), t(at + 1));
        a
    }

    #[test]
    fn a_continuation_is_the_next_turn_and_sees_the_turns_before_it() {
        let mut c = Conversations::new(DEFAULT_RETENTION, DEFAULT_MAX_TRANSCRIPT_BYTES);
        let a = ended_conversation(&mut c, 0);
        let from = c.continuable("t", a, false).unwrap();
        assert_eq!(
            from.from,
            Place {
                conversation: a,
                turn: 1
            }
        );
        let b = Uuid::now_v7();
        assert_eq!(
            c.continue_with(from.from, b, inherited(), "second".into(), t(5)),
            2
        );
        assert_eq!(
            c.place(b),
            Some(Place {
                conversation: a,
                turn: 2
            })
        );
        let h = c.history(b).unwrap();
        let texts: Vec<&str> = h.entries.iter().map(|(_, _, e)| &*e.text).collect();
        assert_eq!(texts, ["first", "one"]);
        assert!(c.history(a).is_none());
        // a is no longer the latest; b is live.
        assert_eq!(
            c.continuable("t", a, false).unwrap_err(),
            Refusal::NotLatest { latest: b }
        );
        assert!(matches!(
            c.continuable("t", b, false),
            Err(Refusal::Busy(_))
        ));
        // Another tenant's agent is as unknown.
        assert_eq!(c.continuable("u", a, true).unwrap_err(), Refusal::Expired);
    }

    #[test]
    fn a_fork_copies_the_history_up_to_its_origin_into_a_conversation_of_its_own() {
        let mut c = Conversations::new(DEFAULT_RETENTION, DEFAULT_MAX_TRANSCRIPT_BYTES);
        let a = ended_conversation(&mut c, 0);
        let b = Uuid::now_v7();
        let from = c.continuable("t", a, false).unwrap().from;
        c.continue_with(from, b, inherited(), "second".into(), t(5));
        c.end(b, AgentStatus::Failed, None, None, "two".into(), t(6));
        let from = c.continuable("t", a, true).unwrap().from;
        let f = Uuid::now_v7();
        assert_eq!(c.fork(from, f, inherited(), "fork".into(), t(7)), 2);
        assert_eq!(
            c.place(f),
            Some(Place {
                conversation: f,
                turn: 2
            })
        );
        let (id, _, entries) = c
            .transcript(TranscriptOf::Conversation(f), |t| t == "t")
            .unwrap();
        assert_eq!(id, f);
        let texts: Vec<&str> = entries.iter().map(|(_, _, e)| &*e.text).collect();
        assert_eq!(texts, ["first", "one", "fork"]);
        // The original is untouched and a still belongs to it.
        assert_eq!(
            c.place(a),
            Some(Place {
                conversation: a,
                turn: 1
            })
        );
        let (_, _, all) = c
            .transcript(TranscriptOf::Conversation(a), |_| true)
            .unwrap();
        assert_eq!(all.len(), 4);
        let (_, _, upto_a) = c.transcript(TranscriptOf::Agent(a), |_| true).unwrap();
        assert_eq!(upto_a.len(), 2);
    }

    #[test]
    fn an_ended_conversation_is_kept_as_its_row_and_reads_and_changes_as_before() {
        let mut c = Conversations::new(DEFAULT_RETENTION, DEFAULT_MAX_TRANSCRIPT_BYTES);
        c.track_changes();
        let a = Uuid::now_v7();
        c.begin(a, "t".into(), inherited(), "first".into(), t(0));
        c.record(a, EntryKind::ToolCall, "shell".into(), t(1));
        assert!(matches!(c.by_id[&a], Held::Open(_)));
        c.end(a, AgentStatus::Done, None, None, "one".into(), t(2));
        let Held::Ended(row) = &c.by_id[&a] else {
            panic!("an ended conversation is kept as its row");
        };
        assert!(row.len() < 160, "{} bytes", row.len());
        let before = c.get(a).unwrap().into_owned();
        assert_eq!(before.turns[0].entries.len(), 3);
        // An entry for an ended turn is not recorded, and nothing opens.
        c.record(a, EntryKind::Steer, "late".into(), t(3));
        assert!(matches!(c.by_id[&a], Held::Ended(_)));
        // A workspace saved after the end changes the row, which the store
        // gets and which stays packed.
        let (changed, _) = c.take_changes();
        assert_eq!(changed.len(), 1);
        let saved = Arc::new(Workspace {
            branch: "subagentd/a".into(),
            kept: true,
            base_commit: "b".repeat(40),
            head_commit: "h".repeat(40),
            files_changed: 1,
            insertions: 1,
            deletions: 0,
        });
        c.set_workspace(a, &saved);
        assert!(matches!(c.by_id[&a], Held::Ended(_)));
        let after = c.get(a).unwrap().into_owned();
        assert!(matches!(
            &after.turns[0].entries[2].kind,
            EntryKind::Result { workspace: Some(w), .. } if **w == *saved
        ));
        let (changed, _) = c.take_changes();
        assert_eq!(changed.len(), 1);
        assert_eq!(row::decode(&changed[0].1).unwrap(), after);
        // Continuing opens it; ending the continuation packs it again,
        // and both agents are found until it expires.
        let from = c.continuable("t", a, false).unwrap().from;
        let b = Uuid::now_v7();
        c.continue_with(from, b, inherited(), "second".into(), t(4));
        assert!(matches!(c.by_id[&a], Held::Open(_)));
        c.end(b, AgentStatus::Done, None, None, "two".into(), t(5));
        assert!(matches!(c.by_id[&a], Held::Ended(_)));
        assert!(c.ended_with_placed.contains(&a));
        assert_eq!(c.history(b).unwrap().entries.len(), 3);
        assert_eq!(c.sweep(t(5) + DEFAULT_RETENTION), 1);
        assert!(c.place(a).is_none() && c.place(b).is_none());
        assert!(c.placed.is_empty() && c.ended_with_placed.is_empty());
    }

    #[test]
    fn retention_counts_from_the_end_of_the_latest_turn() {
        let mut c = Conversations::new(Duration::from_secs(100), DEFAULT_MAX_TRANSCRIPT_BYTES);
        let a = ended_conversation(&mut c, 0);
        let b = Uuid::now_v7();
        let from = c.continuable("t", a, false).unwrap().from;
        c.continue_with(from, b, inherited(), "second".into(), t(50));
        // Live: never swept.
        assert_eq!(c.sweep(t(1000)), 0);
        c.end(b, AgentStatus::Cancelled, None, None, "".into(), t(1000));
        assert_eq!(c.sweep(t(1099)), 0);
        assert_eq!(c.sweep(t(1100)), 1);
        assert!(c.place(a).is_none() && c.place(b).is_none() && c.is_empty());
        assert_eq!(c.continuable("t", b, false).unwrap_err(), Refusal::Expired);
    }

    #[test]
    fn past_the_bound_the_oldest_entries_are_elided_and_counted() {
        let mut c = Conversations::new(DEFAULT_RETENTION, MIN_MAX_TRANSCRIPT_BYTES);
        let a = Uuid::now_v7();
        let kb = |ch: char| -> Arc<str> { ch.to_string().repeat(1024).into() };
        c.begin(a, "t".into(), inherited(), kb('p'), t(0));
        for ch in ['a', 'b', 'c'] {
            c.record(a, EntryKind::Steer, kb(ch), t(1));
        }
        assert_eq!(c.get(a).unwrap().elided, Elided::default());
        c.record(a, EntryKind::ToolCall, kb('d'), t(2));
        let conv = c.get(a).unwrap();
        assert_eq!(conv.elided.entries, 1);
        assert_eq!(conv.elided.bytes, 1024);
        assert_eq!(conv.text_bytes(), 4096);
        assert_eq!(&conv.turns[0].entries[0].text[..1], "a");
        // One entry alone over the bound keeps its end.
        let huge: Arc<str> = format!("{}END", "x".repeat(10_000)).into();
        c.end(a, AgentStatus::Done, None, None, huge, t(3));
        let conv = c.get(a).unwrap();
        assert_eq!(conv.text_bytes(), 4096);
        assert!(conv.turns[0].entries[0].text.ends_with("END"));
        assert_eq!(conv.elided.entries, 5);
        assert_eq!(conv.elided.bytes, 5 * 1024 + (10_003 - 4096) as u64);
    }

    #[test]
    fn a_restored_conversation_is_found_and_expires_like_before() {
        let mut c = Conversations::new(Duration::from_secs(10), DEFAULT_MAX_TRANSCRIPT_BYTES);
        c.track_changes();
        let a = ended_conversation(&mut c, 0);
        let b = Uuid::now_v7();
        let from = c.continuable("t", a, false).unwrap().from;
        c.continue_with(from, b, inherited(), "second".into(), t(5));
        c.end(b, AgentStatus::Done, None, None, "two".into(), t(6));
        let (changed, removed) = c.take_changes();
        assert_eq!(changed.len(), 1);
        assert!(removed.is_empty());
        let mut back = Conversations::new(Duration::from_secs(10), DEFAULT_MAX_TRANSCRIPT_BYTES);
        let (id, bytes) = changed.into_iter().next().unwrap();
        assert_eq!(id, a);
        back.restore(row::decode(&bytes).unwrap());
        assert_eq!(
            back.place(b),
            Some(Place {
                conversation: a,
                turn: 2
            })
        );
        assert_eq!(
            back.place(a),
            Some(Place {
                conversation: a,
                turn: 1
            })
        );
        assert_eq!(back.sweep(t(15)), 0);
        assert_eq!(back.sweep(t(16)), 1);
    }
}
