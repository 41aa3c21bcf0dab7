//! Aligned text tables and readable timestamps for the human output.

use awareness_core::Timestamp;

/// Renders rows under headers, each column as wide as its widest cell, two spaces apart.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            out.push_str(cell);
            if i + 1 < widths.len() {
                out.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(&mut headers.iter().copied());
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
        out.push('\n');
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS.mmmZ` in UTC.
pub fn time(t: Timestamp) -> String {
    let ms = t.millis();
    let days = ms.div_euclid(Timestamp::DAY_MS);
    let rem = ms.rem_euclid(Timestamp::DAY_MS);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1_000 % 60,
        rem % 1_000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(time(Timestamp(0)), "1970-01-01 00:00:00.000Z");
        assert_eq!(
            time(Timestamp(1_800_000_000_000)),
            "2027-01-15 08:00:00.000Z"
        );
        assert_eq!(time(Timestamp(951_782_400_123)), "2000-02-29 00:00:00.123Z");
    }

    #[test]
    fn tables_align() {
        let t = render(
            &["a", "bb"],
            &[
                vec!["long".into(), "x".into()],
                vec!["s".into(), "yy".into()],
            ],
        );
        assert_eq!(t, "a     bb\nlong  x\ns     yy\n");
    }
}
