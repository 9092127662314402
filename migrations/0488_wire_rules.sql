-- Catch-up reads are assembled in Postgres (store/reads.py, fetch_body): the records' wire form is
-- built by the server that holds them, so a page crosses the wire as one value instead of a row per
-- record decoded and re-encoded in Python. These are the rules that form needs, as SQL.
--
-- domain.media.is_json, for a stored content type (NULL is the default, application/json): the media
-- type without parameters, case-insensitively, is application/json or a structured-syntax +json type.
-- tests/test_catchup_reads.py checks that both agree on generated content types.
CREATE FUNCTION wfs_is_json(content_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN content_type IS NULL
    OR lower(btrim(split_part(content_type, ';', 1), E' \t\n\r\f\v')) = 'application/json'
    OR lower(btrim(split_part(content_type, ';', 1), E' \t\n\r\f\v')) LIKE '%+json';
