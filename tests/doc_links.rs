//! Every relative link in the repository's Markdown resolves: the file or
//! folder it names exists, and an anchor (`#section`, `file.md#section`)
//! names a heading of that file, as GitHub makes heading anchors. External
//! links are not fetched (CI has no network beyond package registries).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// Folders never searched for Markdown: build output, installed tools.
const SKIPPED: &[&str] = &[
    "target",
    "node_modules",
    ".git",
    "venv",
    "tools",
    "artifacts",
];

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIPPED.contains(&name.as_str()) {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// GitHub's anchor of a heading: lowercase; letters, digits, `-` and `_`
/// kept, spaces to `-`, everything else dropped; a repeated one gets
/// `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new_ext(text, Options::all()) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let h = heading.take().unwrap_or_default();
                let slug: String = h
                    .to_lowercase()
                    .chars()
                    .filter_map(|c| match c {
                        ' ' => Some('-'),
                        c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                        _ => None,
                    })
                    .collect();
                let n = seen.entry(slug.clone()).or_default();
                out.insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
                *n += 1;
            }
            _ => {}
        }
    }
    out
}

/// The link targets of a Markdown text (links and images).
fn links(text: &str) -> Vec<String> {
    Parser::new_ext(text, Options::all())
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                Some(dest_url.into_string())
            }
            _ => None,
        })
        .collect()
}

/// (relative links checked, the broken ones).
fn broken_links(root: &Path) -> (usize, Vec<String>) {
    let mut files = Vec::new();
    markdown_files(root, &mut files);
    files.sort();
    assert!(files.iter().any(|f| f.ends_with("README.md")), "{files:?}");
    let (mut checked, mut broken) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{shown}: {link}: no such file or folder"));
                continue;
            }
            let is_markdown = target.extension().is_some_and(|e| e == "md");
            if !anchor.is_empty() && is_markdown {
                let headings = anchors(&std::fs::read_to_string(&target).unwrap());
                if !headings.contains(anchor) {
                    broken.push(format!("{shown}: {link}: no heading with that anchor"));
                }
            }
        }
    }
    (checked, broken)
}

#[test]
fn every_relative_link_in_the_markdown_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (checked, broken) = broken_links(root);
    assert!(
        checked >= 20,
        "only {checked} relative links found: is the parser reading them?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_missing_file_and_a_missing_anchor_are_both_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("README.md"),
        "# Title\n\n## Set up `it`\n\n## Set up `it`\n\n[ok](#set-up-it-1) [ok](other.md#part-two) \
         [ok](https://example.com/#x) `[not a link](nowhere.md)`\n\n\
         [gone](nowhere.md) [bad anchor](#set-up) [bad there](other.md#part-three)\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("other.md"), "# Part two\n").unwrap();
    let (checked, broken) = broken_links(dir.path());
    assert_eq!(checked, 5);
    assert_eq!(
        broken,
        [
            "README.md: nowhere.md: no such file or folder",
            "README.md: #set-up: no heading with that anchor",
            "README.md: other.md#part-three: no heading with that anchor",
        ],
        "{broken:?}"
    );
}
