"""Reading runs and lining them up like with like: run dirs, copies, groups and labels, the validation-set and budget checks, the point of comparison, sweep membership."""
