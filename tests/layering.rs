//! The dependency rules of ARCHITECTURE.md ("Dependency rules"), checked on
//! every `src/**/*.rs`: each import points down the layers, and no two
//! modules import each other, directly or through others.
//!
//! An import is any path that starts with `crate`, `super` or `self` (or a
//! child module's name): in `use` lists, in expressions and types, and in
//! macro arguments. A path through a module's re-export counts as an import
//! of the file that defines the item, so a module root that only declares
//! and re-exports is never part of a circle. Test code (`#[cfg(test)]`
//! items and test-only files) is not checked. The files are parsed with
//! `syn`, not matched with patterns.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    path::Path,
};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// One source file, by its path from the repository root.
#[derive(Debug, Clone)]
struct Source {
    path: String,
    text: String,
}

/// The crates under `src/` whose modules are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Crate {
    /// The `subagentd` library.
    Lib,
    /// The load generator, `src/bin/subagentd-bench/`.
    Bench,
}

const BENCH_DIR: &str = "src/bin/subagentd-bench/";

/// The crate and module path of a file; None for a file no crate checked
/// here compiles as a module (the `subagentd` binary's `main.rs` imports
/// only the library).
fn module_of(path: &str) -> Option<(Crate, Vec<String>)> {
    let (krate, rel) = if let Some(rel) = path.strip_prefix(BENCH_DIR) {
        (Crate::Bench, rel)
    } else {
        let rel = path.strip_prefix("src/")?;
        if rel.starts_with("bin/") || rel == "main.rs" {
            return None;
        }
        (Crate::Lib, rel)
    };
    let rel = rel.strip_suffix(".rs")?;
    let mut parts: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    Some((krate, parts))
}

/// A path as written in one file, with where it is.
#[derive(Debug, Clone)]
struct Written {
    segments: Vec<String>,
    line: usize,
}

/// A `pub use` of a module: `name` stands for `segments`.
#[derive(Debug, Clone)]
struct ReExport {
    /// None for a glob.
    name: Option<String>,
    segments: Vec<String>,
}

/// What one file says about imports.
#[derive(Debug, Default)]
struct Parsed {
    imports: Vec<Written>,
    re_exports: Vec<ReExport>,
    /// Child modules declared `#[cfg(test)] mod name;`.
    test_children: Vec<String>,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The leaves of a `use` tree: (segments, the name it binds; None for a
/// glob).
fn use_leaves(
    prefix: &mut Vec<String>,
    tree: &syn::UseTree,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(prefix, &p.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.clone(), prefix.last().cloned()));
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push((path, Some(n.ident.to_string())));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_leaves(prefix, tree, out);
            }
        }
    }
}

fn starts_relative(first: &str) -> bool {
    matches!(first, "crate" | "super" | "self")
}

/// Paths such as `crate::a::b` inside a macro's tokens (`tracing::info!`
/// arguments, `matches!` patterns): the parser leaves those unparsed.
fn macro_paths(tokens: TokenStream, out: &mut Vec<Written>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => macro_paths(g.stream(), out),
            TokenTree::Ident(ident) if starts_relative(&ident.to_string()) => {
                let line = ident.span().start().line;
                let mut segments = vec![ident.to_string()];
                let mut j = i + 1;
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(next)),
                ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    segments.push(next.to_string());
                    j += 3;
                }
                if segments.len() > 1 {
                    out.push(Written { segments, line });
                }
                i = j.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

#[derive(Default)]
struct Collector {
    parsed: Parsed,
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_cfg_test(item_attrs(item)) {
            if let syn::Item::Mod(m) = item {
                if m.content.is_none() {
                    self.parsed.test_children.push(m.ident.to_string());
                }
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // An inline module other than a test module would shift what
        // `super` means; none exists, and this check says so if one comes.
        assert!(
            m.content.is_none(),
            "inline module `{}`: give it a file (the layering check resolves paths per file)",
            m.ident
        );
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.use_token.span.start().line;
        let mut leaves = Vec::new();
        use_leaves(&mut Vec::new(), &u.tree, &mut leaves);
        let public = !matches!(u.vis, syn::Visibility::Inherited);
        for (segments, name) in leaves {
            if public {
                self.parsed.re_exports.push(ReExport {
                    name: name.clone(),
                    segments: segments.clone(),
                });
            }
            self.parsed.imports.push(Written { segments, line });
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let first = path.segments[0].ident.to_string();
            if starts_relative(&first) {
                self.parsed.imports.push(Written {
                    segments: path.segments.iter().map(|s| s.ident.to_string()).collect(),
                    line: path.segments[0].ident.span().start().line,
                });
            }
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        macro_paths(mac.tokens.clone(), &mut self.parsed.imports);
        syn::visit::visit_macro(self, mac);
    }
}

fn parse(source: &Source) -> Parsed {
    let file = syn::parse_file(&source.text)
        .unwrap_or_else(|e| panic!("{}: does not parse: {e}", source.path));
    let mut collector = Collector::default();
    collector.visit_file(&file);
    collector.parsed
}

/// A module of one crate.
type ModKey = (Crate, Vec<String>);

/// The import graph of the checked crates.
struct Graph {
    /// Module → its file.
    files: BTreeMap<ModKey, String>,
    parsed: HashMap<ModKey, Parsed>,
    /// File → file it imports → the first import that makes the edge.
    edges: BTreeMap<String, BTreeMap<String, (usize, String)>>,
}

impl Graph {
    fn build(sources: &[Source]) -> Self {
        let mut files = BTreeMap::new();
        let mut parsed = HashMap::new();
        for source in sources {
            if let Some((krate, path)) = module_of(&source.path) {
                files.insert((krate, path.clone()), source.path.clone());
                parsed.insert((krate, path), parse(source));
            }
        }
        // Test-only files are not checked.
        let test_only: Vec<ModKey> = parsed
            .iter()
            .flat_map(|((krate, path), p)| {
                p.test_children.iter().map(move |child| {
                    let mut child_path = path.clone();
                    child_path.push(child.clone());
                    (*krate, child_path)
                })
            })
            .collect();
        for key in &test_only {
            files.retain(|(krate, path), _| !(*krate == key.0 && path.starts_with(&key.1)));
            parsed.retain(|(krate, path), _| !(*krate == key.0 && path.starts_with(&key.1)));
        }
        let mut graph = Graph {
            files,
            parsed,
            edges: BTreeMap::new(),
        };
        let keys: Vec<ModKey> = graph.files.keys().cloned().collect();
        for key in keys {
            let from = graph.files[&key].clone();
            let imports = graph.parsed[&key].imports.clone();
            for import in imports {
                let Some(absolute) = graph.absolute(&key, &import.segments) else {
                    continue;
                };
                let target = graph.resolve(key.0, &absolute, 0);
                let Some(to) = graph.files.get(&(key.0, target)) else {
                    continue;
                };
                if *to != from {
                    graph
                        .edges
                        .entry(from.clone())
                        .or_default()
                        .entry(to.clone())
                        .or_insert((import.line, import.segments.join("::")));
                }
            }
        }
        graph
    }

    /// `segments` as written in module `at`, from its crate's root; None
    /// for a path outside the crate.
    fn absolute(&self, at: &ModKey, segments: &[String]) -> Option<Vec<String>> {
        let (krate, here) = at;
        let first = segments.first()?;
        let mut path = match first.as_str() {
            "crate" => return Some(segments[1..].to_vec()),
            "self" => here.clone(),
            "super" => {
                let mut path = here.clone();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    path.pop()?;
                    rest = &rest[1..];
                }
                path.extend(rest.iter().cloned());
                return Some(path);
            }
            // A child module named without `self::` (2018 paths).
            child => {
                let mut path = here.clone();
                path.push(child.to_owned());
                if !self.files.contains_key(&(*krate, path)) {
                    return None;
                }
                here.clone()
            }
        };
        let skip = usize::from(first == "self");
        path.extend(segments[skip..].iter().cloned());
        Some(path)
    }

    /// The module that defines what `path` names, following re-exports.
    fn resolve(&self, krate: Crate, path: &[String], depth: usize) -> Vec<String> {
        let mut module: Vec<String> = Vec::new();
        for (i, segment) in path.iter().enumerate() {
            let mut next = module.clone();
            next.push(segment.clone());
            if self.files.contains_key(&(krate, next.clone())) {
                module = next;
                continue;
            }
            if depth < 8 {
                if let Some(parsed) = self.parsed.get(&(krate, module.clone())) {
                    let key = (krate, module.clone());
                    for re in &parsed.re_exports {
                        let Some(target) = self.absolute(&key, &re.segments) else {
                            continue;
                        };
                        match &re.name {
                            Some(name) if name == segment => {
                                let mut rest = target;
                                rest.extend(path[i + 1..].iter().cloned());
                                return self.resolve(krate, &rest, depth + 1);
                            }
                            None => {
                                let mut rest = target.clone();
                                rest.extend(path[i..].iter().cloned());
                                let found = self.resolve(krate, &rest, depth + 1);
                                if found != target && found != module {
                                    return found;
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            return module;
        }
        module
    }
}

/// A layer of the library, bottom (0) to top.
fn layer(top: &str) -> Option<(u8, &'static str)> {
    Some(match top {
        "config" => (0, "config"),
        "scheduler" | "tls" => (1, "domain"),
        "runner" | "store" | "auth" | "telemetry" | "ha" => (2, "adapter"),
        "pb" => (3, "generated code"),
        "wire" | "client" => (4, "wire"),
        "api" | "cli" | "worker" | "mcp" => (5, "api and clients"),
        "server" | "fuzzing" => (6, "wiring"),
        _ => return None,
    })
}

/// What each layer may import (the rule a violation names).
fn rule(rank: u8) -> &'static str {
    match rank {
        0 => "config is the leaf: it imports nothing of the crate",
        1 => "the domain (scheduler) and tls import only config",
        2 => {
            "adapters (runner, store, auth, telemetry, ha) import config, scheduler and tls, \
              and never each other except where named"
        }
        3 => "the generated code (pb) imports nothing of the crate",
        4 => "the conversions (wire) and the shared client module import only the layers below",
        5 => {
            "api and the clients (cli, worker, mcp) import the layers below; a client never \
              imports api or server"
        }
        _ => "server and fuzzing compose everything below them",
    }
}

/// Imports across modules of one layer that the rules name: (from file,
/// files under `to`, why).
const NAMED: &[(&str, &str, &str)] = &[
    (
        "src/ha.rs",
        "src/store/",
        "the election takes the PostgreSQL lease (its client, options and errors)",
    ),
    (
        "src/telemetry/metrics.rs",
        "src/store/writer.rs",
        "metrics read the writer's commit counts",
    ),
    (
        "src/cli/mod.rs",
        "src/worker/mod.rs",
        "`subagentd worker` is a subcommand of the CLI",
    ),
    (
        "src/cli/mod.rs",
        "src/mcp/stdio.rs",
        "`subagentd mcp` is a subcommand of the CLI",
    ),
];

fn top_of(path: &str) -> Option<&str> {
    let (Crate::Lib, module) = module_of(path)? else {
        return None;
    };
    // `lib.rs` only declares the modules.
    let top = module.first()?.clone();
    layer(&top)?;
    Some(match top.as_str() {
        "config" => "config",
        "scheduler" => "scheduler",
        "tls" => "tls",
        "runner" => "runner",
        "store" => "store",
        "auth" => "auth",
        "telemetry" => "telemetry",
        "ha" => "ha",
        "pb" => "pb",
        "wire" => "wire",
        "client" => "client",
        "api" => "api",
        "cli" => "cli",
        "worker" => "worker",
        "mcp" => "mcp",
        "server" => "server",
        _ => "fuzzing",
    })
}

/// What the check found: imports that break a rule, and circles.
#[derive(Debug, Default)]
struct Report {
    violations: Vec<String>,
    circles: Vec<String>,
}

fn check(sources: &[Source]) -> Report {
    let graph = Graph::build(sources);
    let mut report = Report::default();
    for (from, targets) in &graph.edges {
        for (to, (line, written)) in targets {
            let (Some(from_top), Some(to_top)) = (top_of(from), top_of(to)) else {
                continue;
            };
            if from_top == to_top {
                continue;
            }
            let (from_rank, from_layer) = layer(from_top).expect("a layer");
            let (to_rank, to_layer) = layer(to_top).expect("a layer");
            let named = NAMED.iter().any(|(f, t, _)| f == from && to.starts_with(t));
            if to_rank < from_rank || (to_rank == from_rank && named) {
                continue;
            }
            report.violations.push(format!(
                "{from}:{line}: `{written}` imports {to}: {from_top} ({from_layer}) may not import \
                 {to_top} ({to_layer}); rule: {}",
                rule(from_rank)
            ));
        }
    }
    for circle in strongly_connected(&graph.edges) {
        let mut text = String::from("these files import each other:");
        for from in &circle {
            for (to, (line, written)) in &graph.edges[from] {
                if circle.contains(to) {
                    let _ = write!(text, "\n  {from}:{line}: `{written}` imports {to}");
                }
            }
        }
        report.circles.push(text);
    }
    report
}

/// The strongly connected components of more than one file (Tarjan).
fn strongly_connected(
    edges: &BTreeMap<String, BTreeMap<String, (usize, String)>>,
) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, (usize, String)>>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(targets) = s.edges.get(v) {
            for w in targets.keys() {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.insert(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// Every `.rs` file under `src/`.
fn read_sources() -> Vec<Source> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<Source>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).expect("under the root");
                out.push(Source {
                    path: rel.to_string_lossy().replace('\\', "/"),
                    text: std::fs::read_to_string(&path).expect("a readable source file"),
                });
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    walk(root, &root.join("src"), &mut out);
    out
}

#[test]
fn every_import_in_src_points_down_the_layers_and_none_circles() {
    let sources = read_sources();
    let graph = Graph::build(&sources);
    for (from, to, why) in NAMED {
        assert!(
            graph
                .edges
                .get(*from)
                .is_some_and(|targets| targets.keys().any(|t| t.starts_with(to))),
            "the named exception {from} -> {to} ({why}) is used by no import: remove it"
        );
    }
    let report = check(&sources);
    assert!(
        report.violations.is_empty() && report.circles.is_empty(),
        "{}",
        report
            .violations
            .iter()
            .chain(&report.circles)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The check sees imports of every kind: a `use` list, a path in an
/// expression, one through a re-export, one in a macro, in both crates.
#[test]
fn the_check_resolves_imports_to_the_files_that_define_them() {
    let graph = Graph::build(&read_sources());
    let edge = |from: &str, to: &str| {
        graph
            .edges
            .get(from)
            .is_some_and(|targets| targets.contains_key(to))
    };
    // `use crate::scheduler::{..., Scheduler}`: through the root's re-export.
    assert!(edge("src/api/service.rs", "src/scheduler/handle/mod.rs"));
    // `crate::config::ModelRef` re-exported by scheduler::types, defined in
    // config/limits.rs.
    assert!(edge("src/wire/requests.rs", "src/config/limits.rs"));
    // A macro argument: `target: core_mod::LIFECYCLE` in `tracing::info!`.
    assert!(edge(
        "src/scheduler/handle/mod.rs",
        "src/scheduler/core/mod.rs"
    ));
    // The load generator is checked as its own crate.
    assert!(edge(
        "src/bin/subagentd-bench/scenarios.rs",
        "src/bin/subagentd-bench/cli.rs"
    ));
    // Test-only files are left out.
    assert!(!graph.edges.contains_key("src/scheduler/handle/tests.rs"));
    assert!(graph.edges.values().map(BTreeMap::len).sum::<usize>() > 300);
}

/// The source with `line` appended to the file at `path`, and the number
/// of that line.
fn planted(path: &str, line: &str) -> (Vec<Source>, usize) {
    let mut sources = read_sources();
    let source = sources
        .iter_mut()
        .find(|s| s.path == path)
        .unwrap_or_else(|| panic!("{path} exists"));
    source.text.push_str(line);
    source.text.push('\n');
    let number = source.text.lines().count();
    (sources, number)
}

#[test]
fn a_planted_upward_import_is_named_with_its_file_line_and_rule() {
    let (sources, line) = planted(
        "src/config/mod.rs",
        "use crate::api::service::AgentServiceImpl;",
    );
    let report = check(&sources);
    let expected = format!(
        "src/config/mod.rs:{line}: `crate::api::service::AgentServiceImpl` imports \
         src/api/service.rs: config (config) may not import api (api and clients); rule: config \
         is the leaf: it imports nothing of the crate"
    );
    assert_eq!(report.violations, vec![expected]);
}

#[test]
fn a_planted_import_between_adapters_is_refused() {
    let (sources, line) = planted(
        "src/runner/command.rs",
        "fn planted() { let _ = crate::store::StoreError::Busy; }",
    );
    let report = check(&sources);
    assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    assert!(
        report.violations[0].starts_with(&format!(
            "src/runner/command.rs:{line}: `crate::store::StoreError::Busy` imports src/store/mod.rs: \
             runner (adapter) may not import store (adapter)"
        )),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_client_importing_api_is_refused() {
    let (sources, _) = planted("src/worker/mod.rs", "use crate::api::status::reason_of;");
    let report = check(&sources);
    assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    assert!(
        report.violations[0].contains("a client never imports api or server"),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_planted_circle_is_found_and_each_of_its_imports_named() {
    // types.rs is imported by the handle; importing the handle back closes
    // a circle inside one layer, which the layer rule alone would allow.
    let (sources, line) = planted("src/scheduler/types.rs", "use crate::scheduler::Scheduler;");
    let report = check(&sources);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.circles.len(), 1, "{:?}", report.circles);
    let circle = &report.circles[0];
    assert!(
        circle.contains(&format!(
            "src/scheduler/types.rs:{line}: `crate::scheduler::Scheduler` imports \
             src/scheduler/handle/mod.rs"
        )),
        "{circle}"
    );
    assert!(circle.contains("src/scheduler/handle/mod.rs:"), "{circle}");
}
