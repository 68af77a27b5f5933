//! A three-row block font for the headline number ("21.5K"), readable from across the room.

/// Glyph rows for one character, or `None` for characters the font lacks.
fn glyph(c: char) -> Option<[&'static str; 3]> {
    Some(match c {
        '0' => ["█▀█", "█ █", "▀▀▀"],
        '1' => ["▀█ ", " █ ", "▀▀▀"],
        '2' => ["▀▀█", "█▀▀", "▀▀▀"],
        '3' => ["▀▀█", " ▀█", "▀▀▀"],
        '4' => ["█ █", "▀▀█", "  ▀"],
        '5' => ["█▀▀", "▀▀█", "▀▀▀"],
        '6' => ["█▀▀", "█▀█", "▀▀▀"],
        '7' => ["▀▀█", "  █", "  ▀"],
        '8' => ["█▀█", "█▀█", "▀▀▀"],
        '9' => ["█▀█", "▀▀█", "▀▀▀"],
        '.' => [" ", " ", "▀"],
        'K' => ["█ ▄▀", "██▄ ", "▀  ▀"],
        'M' => ["█▄ ▄█", "█ ▀ █", "▀   ▀"],
        'G' => ["█▀▀", "█ █", "▀▀▀"],
        '—' | '–' | '-' => ["   ", "▀▀▀", "   "],
        ' ' => [" ", " ", " "],
        _ => return None,
    })
}

/// The three rows of `text` in the block font, glyphs one column apart. `None` when a
/// character has no glyph (the caller then prints the text plainly).
pub fn render(text: &str) -> Option<[String; 3]> {
    let mut rows = [String::new(), String::new(), String::new()];
    for (i, c) in text.chars().enumerate() {
        let g = glyph(c)?;
        for (row, part) in rows.iter_mut().zip(g) {
            if i > 0 {
                row.push(' ');
            }
            row.push_str(part);
        }
    }
    Some(rows)
}

/// Display width of the rendered text.
pub fn width(text: &str) -> usize {
    render(text).map_or(text.chars().count(), |rows| rows[0].chars().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_throughput_in_three_even_rows() {
        let rows = render("21.5K").unwrap();
        assert_eq!(rows[0], "▀▀█ ▀█    █▀▀ █ ▄▀");
        let widths: Vec<usize> = rows.iter().map(|r| r.chars().count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{widths:?}");
        assert_eq!(width("21.5K"), widths[0]);
    }

    #[test]
    fn unknown_characters_fall_back_to_plain_text() {
        assert!(render("n/a").is_none());
        assert_eq!(width("n/a"), 3);
    }
}
