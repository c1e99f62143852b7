"""The hang watch, the hang report, and what a rank records and answers for them."""
