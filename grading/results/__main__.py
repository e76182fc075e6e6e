"""`python -m grading.results --reports DIR`: assemble the check files of a run (scoring.main)."""
from grading.results.scoring import main

raise SystemExit(main())
