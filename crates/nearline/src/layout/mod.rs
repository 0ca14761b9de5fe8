//! Index format: manifest, sections, page files and record placement.
