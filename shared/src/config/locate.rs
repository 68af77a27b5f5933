//! Maps byte spans in a TOML document to dotted key paths and key paths to line numbers, so
//! errors can say `training.num_anchors (line 12)`.
use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// A parsed document kept only for locating keys.
pub(crate) struct SourceMap<'i> {
    text: &'i str,
    root: DeTable<'i>,
}

impl<'i> SourceMap<'i> {
    pub(crate) fn parse(text: &'i str) -> Result<Self, toml::de::Error> {
        Ok(Self {
            text,
            root: DeTable::parse(text)?.into_inner(),
        })
    }

    /// 1-based line of a byte offset.
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.text.as_bytes()[..offset.min(self.text.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    /// The deepest key path whose key or value span contains `span`, with the key's line.
    ///
    /// Standard `[table]` values span only their header, so every table is searched, not only
    /// the one whose span contains the error.
    pub(crate) fn path_at(&self, span: &Range<usize>) -> (String, Option<usize>) {
        find_in_table(&self.root, span, "", self).unwrap_or_default()
    }

    /// The line of the key at `path` (dotted, with `[i]` for array items), if present.
    pub(crate) fn line_of_path(&self, path: &str) -> Option<usize> {
        let mut table = &self.root;
        let mut segments = split_path(path).into_iter().peekable();
        let mut line = None;
        while let Some((key, index)) = segments.next() {
            let (k, v) = table.iter().find(|(k, _)| k.get_ref().as_ref() == key)?;
            line = Some(self.line_of(k.span().start));
            let mut value = v.get_ref();
            if let Some(i) = index {
                let item = value.as_array()?.get(i)?;
                line = Some(self.line_of(item.span().start));
                value = item.get_ref();
            }
            if segments.peek().is_some() {
                table = value.as_table()?;
            }
        }
        line
    }
}

fn contains(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    outer.start <= inner.start && inner.end <= outer.end && outer.start < outer.end
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

type Found = Option<(String, Option<usize>)>;

fn find_in_table(
    table: &DeTable<'_>,
    span: &Range<usize>,
    prefix: &str,
    map: &SourceMap<'_>,
) -> Found {
    for (k, v) in table.iter() {
        let path = join(prefix, k.get_ref());
        let line = Some(map.line_of(k.span().start));
        if contains(&k.span(), span) {
            return Some((path, line));
        }
        if let Some(found) = find_in_value(v.get_ref(), span, &path, map) {
            return Some(found);
        }
        if contains(&v.span(), span) {
            return Some((path, line));
        }
    }
    None
}

fn find_in_value(
    value: &DeValue<'_>,
    span: &Range<usize>,
    path: &str,
    map: &SourceMap<'_>,
) -> Found {
    match value {
        DeValue::Table(t) => find_in_table(t, span, path, map),
        DeValue::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            let item_path = format!("{path}[{i}]");
            find_in_value(item.get_ref(), span, &item_path, map).or_else(|| {
                contains(&item.span(), span)
                    .then(|| (item_path, Some(map.line_of(item.span().start))))
            })
        }),
        _ => None,
    }
}

/// `a.b[2].c` → [("a", None), ("b", Some(2)), ("c", None)].
fn split_path(path: &str) -> Vec<(&str, Option<usize>)> {
    path.split('.')
        .filter(|s| !s.is_empty())
        .map(|seg| match seg.split_once('[') {
            Some((key, idx)) => (key, idx.trim_end_matches(']').parse().ok()),
            None => (seg, None),
        })
        .collect()
}
