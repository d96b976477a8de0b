"""The edge dates of #42: year 1 and year 9999, with offsets up to 14 hours either way.
Their shape is valid, so they reach the schedule math and the database, where overflows
once answered 500s. The acceptance test walks them through every route; the fuzzing puts
them into generated bodies."""

EDGE_DATES = (
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+01:00",
    "0001-01-09T00:00:00-14:00",
    "9999-12-31T00:00:00Z",
    "9999-12-31T23:00:00-05:00",
    "9999-11-29T00:00:00+14:00",
)
