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

/// The byte offset of the `[` of the array still open at `offset`, if any (strings and
/// comments skipped). A missing `,` or `]` is noticed by the parser only at the next line's
/// first token, so a syntax error inside an array is reported where the array opens.
pub(crate) fn unclosed_array_at(text: &str, offset: usize) -> Option<usize> {
    let bytes = &text.as_bytes()[..offset.min(text.len())];
    let mut open: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        match bytes[i] {
            b'#' => {
                // A comment runs to the end of the line.
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' | b'\'' => {
                let quote = bytes[i];
                let multi = rest.len() >= 3 && rest[1] == quote && rest[2] == quote;
                i += if multi { 3 } else { 1 };
                while i < bytes.len() {
                    if quote == b'"' && bytes[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if !multi && bytes[i] == b'\n' {
                        break;
                    }
                    let closes = bytes[i] == quote
                        && (!multi || bytes[i..].starts_with(&[quote, quote, quote]));
                    if closes {
                        i += if multi { 2 } else { 0 };
                        break;
                    }
                    i += 1;
                }
            }
            b'[' => open.push(i),
            b']' => {
                open.pop();
            }
            _ => {}
        }
        i += 1;
    }
    open.last().copied()
}

#[cfg(test)]
mod unclosed_array_tests {
    use super::unclosed_array_at;

    #[test]
    fn the_open_bracket_of_an_unclosed_array_is_found_past_strings_and_comments() {
        let text = "[a]\nx = [\"]\", '[', # ]\n  1,\ny = 2\n";
        let at = text.find("y =").unwrap();
        assert_eq!(
            unclosed_array_at(text, at),
            Some(text.find("= [").unwrap() + 2)
        );
        let closed = "[a]\nx = [1, \"]\"]\ny = 2\n";
        assert_eq!(unclosed_array_at(closed, closed.find("y =").unwrap()), None);
        let multi = "x = \"\"\"a]\n[\"\"\"\ny = [1\nz = 1";
        assert_eq!(
            unclosed_array_at(multi, multi.find("z =").unwrap()),
            Some(multi.find("[1").unwrap())
        );
    }
}
