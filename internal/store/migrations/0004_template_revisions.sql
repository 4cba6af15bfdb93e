-- Templates become named lists of immutable revisions (store.go, Tx):
-- revisions get their own table, actors' template column names the
-- revision ("NAME@REV"), and snapshots are indexed by the revision they
-- were captured under, so a revision in use cannot be deleted. Step 5
-- moves existing records over.

CREATE TABLE template_revisions (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    phase       {{text}} NOT NULL,
    template    {{text}} NOT NULL,
    PRIMARY KEY (space, name)
);
CREATE INDEX template_revisions_phase ON template_revisions (phase, space, name);
CREATE INDEX template_revisions_template ON template_revisions (template, space, name);

ALTER TABLE snapshots ADD COLUMN template_uid {{text}} NOT NULL DEFAULT '';
CREATE INDEX snapshots_template_uid ON snapshots (template_uid, space, name);
