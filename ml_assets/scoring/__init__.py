"""After promotion: the champion at work. ``predictions`` scores a day's rows with it."""
