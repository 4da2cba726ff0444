/* cotrain client: mains or battery (see power.h). */
#include "client/power.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

static int read_word(const char *dir, const char *name, const char *file, char *out, size_t len)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/%s/%s", dir, name, file);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	int ok = fgets(out, (int)len, f) != NULL;
	fclose(f);
	out[strcspn(out, "\n")] = '\0';
	return ok;
}

int cl_power_on_ac(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return 1;
	int batteries = 0, mains_online = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		char type[32] = "", online[8] = "";
		if (!read_word(dir, e->d_name, "type", type, sizeof type))
			continue;
		if (strcmp(type, "Battery") == 0)
			batteries++;
		else if (strcmp(type, "Mains") == 0 &&
		         read_word(dir, e->d_name, "online", online, sizeof online) &&
		         strcmp(online, "1") == 0)
			mains_online = 1;
	}
	closedir(d);
	return mains_online || batteries == 0;
}
