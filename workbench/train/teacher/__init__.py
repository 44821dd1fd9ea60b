"""The teacher of an LM run: trained here or found in its cache (lm_teacher), and the precision its forward
runs in, the student's own where it can (teacher_precision)."""
