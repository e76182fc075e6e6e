"""The results layer: what the grader found and what it is worth, from a check to Gradescope.

- record.py: CheckRecord, one check's record (the test that makes it, the file that keeps it,
  the worker-to-controller message, results.json's entry, what the pages read);
- store.py: the files under reports/ (check files, info.json, collected.json, the secret seed, the class);
- scoring.py: the current records of a submission scored with the rubric into results.json;
- gradescope.py: results.json as Gradescope's page, one test per rubric group.

reporting/ reads this layer; nothing here reads reporting/.
"""
